"""The memory rows of benchmarks.perf: properties of what a training step saves for backward as experiences
accumulate, and of the steps and forwards the timing rows run (tiny ViTs, CPU, seconds; nothing timed)."""

from __future__ import annotations

import functools
from contextlib import nullcontext

import pytest
import torch

from avalanche_color import (CLLoRAConfig, CLLoRAViT, ExpertViT, InfLoRAConfig, InfLoRAViT, LoRASubtractionConfig,
                             LoRASubtractionViT, SDLoRAConfig, SDLoRAViT)
from benchmarks.perf.__main__ import replace_section
from benchmarks.perf.learners import CLLoRALearner, CoLoRLearner, InfLoRALearner, LoRASubLearner, SDLoRALearner, grown
from benchmarks.perf.memory import measure_growth
from streams import tiny_vit

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")
RANK, CLASSES = 4, 2
EARLIER, LATER = 2, 6  # experiences; the LATER - EARLIER components or experts between them bring 8 classes
FLOAT = 4  # bytes


def inf_lora() -> InfLoRALearner:
    vit = tiny_vit()
    return InfLoRALearner(InfLoRAViT(vit, InfLoRAConfig(rank=RANK)), CLASSES, tuple(vit.patch_embed.img_size))


def lora_sub() -> LoRASubLearner:
    vit = tiny_vit()
    return LoRASubLearner(LoRASubtractionViT(vit, LoRASubtractionConfig(rank=RANK)), CLASSES,
                          tuple(vit.patch_embed.img_size))


def cl_lora() -> CLLoRALearner:
    return CLLoRALearner(CLLoRAViT(tiny_vit(), CLLoRAConfig(rank=RANK)), CLASSES)


LEARNERS = {
    "CoLoR": lambda: CoLoRLearner(ExpertViT(tiny_vit(), rank=RANK), CLASSES, k=3),
    "SD-LoRA": lambda: SDLoRALearner(SDLoRAViT(tiny_vit(), SDLoRAConfig(rank=RANK)), CLASSES),
    "InfLoRA": inf_lora,
    "LoRA-Sub": lora_sub,
    "CL-LoRA": cl_lora,
}


@functools.cache
def growth(method: str) -> tuple[float, float]:
    """How much more autograd saves for backward at experience LATER than at EARLIER: (bytes per sample,
    bytes whatever the batch), from batches of 2 and 8."""
    def saved(batch: int) -> list[int]:
        x = torch.randn(batch, 3, *tiny_vit().patch_embed.img_size, generator=torch.Generator().manual_seed(1))
        return [m.step.saved for m in measure_growth(LEARNERS[method](), [EARLIER, LATER], x, CPU, nullcontext)]

    (small_before, small_after), (large_before, large_after) = saved(2), saved(8)
    per_sample = ((large_after - large_before) - (small_after - small_before)) / 6
    return per_sample, (small_after - small_before) - 2 * per_sample


@pytest.mark.parametrize("method", LEARNERS)
def test_earlier_experiences_add_nothing_per_sample_to_a_training_step_but_the_logits_of_their_classes(method):
    # The official SD-LoRA code runs every earlier direction low-rank over the tokens, saving
    # tokens x rank floats per sample, part, layer and direction; here frozen experts are not run
    # (CoLoR, CL-LoRA's task-specific adapters) and frozen components are folded into the weight
    # (SD-LoRA, InfLoRA, LoRA-Sub). LoRA-Sub's triplet loss also measures each sample's distance to every
    # stored prototype, one per class learned.
    per_sample, _ = growth(method)
    new_classes = (LATER - EARLIER) * CLASSES
    new_prototypes = new_classes if method == "LoRA-Sub" else 0
    assert 0 < per_sample <= 2 * (new_classes + new_prototypes) * FLOAT


def test_what_grows_whatever_the_batch_is_sd_lora_s_folded_directions_and_lora_sub_s_prototypes():
    # SD-LoRA's earlier magnitudes learn, so the fold keeps each frozen direction's A (concatenated) for
    # their gradients; InfLoRA's fold trains nothing and CoLoR's frozen experts are not in the graph.
    width, depth = tiny_vit().embed_dim, len(tiny_vit().blocks)
    one_factor = RANK * width * FLOAT
    assert growth("CoLoR")[1] < one_factor
    assert growth("InfLoRA")[1] < one_factor
    assert growth("CL-LoRA")[1] < one_factor  # the earlier block weights, for the orthogonality term
    assert growth("SD-LoRA")[1] >= (LATER - EARLIER) * 2 * depth * one_factor
    # LoRA-Sub's fold trains nothing either; its triplet loss keeps the normalised prototypes, once.
    new_prototypes = (LATER - EARLIER) * CLASSES
    assert new_prototypes * width * FLOAT <= growth("LoRA-Sub")[1] < new_prototypes * width * FLOAT + one_factor


def test_a_section_replaces_its_namesake_and_keeps_the_rest():
    text = "# perf\n\ntable\n\n## Memory\n\nold\n\n## Later\n\nkept\n"
    replaced = replace_section(text, "## Memory\n\nnew\n")
    assert replaced == "# perf\n\ntable\n\n## Memory\n\nnew\n\n## Later\n\nkept\n"
    assert replace_section(replaced, "## Memory\n\nnew\n") == replaced
    assert replace_section("table\n", "## Memory\n\nnew") == "table\n\n## Memory\n\nnew\n"


def test_lora_sub_s_step_keeps_a_and_b_in_the_projected_subspace_held_only_while_its_experience_trains():
    learner = grown(lora_sub(), 2)  # experience 2 trains: P from its inputs through the subtracted network
    model, x = learner.model, torch.randn(4, 3, *tiny_vit().patch_embed.img_size)
    width = model.layers[0].in_features
    assert model.projections.shape == (len(model.layers), width, width)
    components = [layer.components[1] for layer in model.layers]
    before = [(c.A.detach().clone(), c.B.detach().clone()) for c in components]
    learner.step(learner.optimizer(), x, learner.labels(1, 4, torch.Generator().manual_seed(0)))
    for component, (A, B), P in zip(components, before, model.projections):
        basis = P * P.trace()  # P = V V^T / ||V V^T||_F, and trace(P) = sqrt(k)
        assert round(float(P.trace()) ** 2) < width  # some direction is left out: the check can fail
        outside = torch.eye(width, dtype=P.dtype) - basis
        dA, dB = (component.A.detach() - A).double(), (component.B.detach() - B).double()
        assert dA.abs().max() > 0 and dB.abs().max() > 0
        # Float32 weights: what is left outside is rounding, far below the update.
        assert (dA @ outside).norm() < 1e-4 * dA.norm() and (outside @ dB).norm() < 1e-4 * dB.norm()
    learner.finish(1)
    assert len(model.projections) == 0 and model.prototypes.shape[0] == 2 * CLASSES


@pytest.mark.parametrize("experiences, steps", [(1, 1), (3, 2)])
def test_cl_lora_s_step_is_two_sgd_steps_once_there_is_a_teacher(experiences, steps, monkeypatch):
    learner = grown(cl_lora(), experiences)
    optimizer, calls = learner.optimizer(), []
    original = optimizer.step
    monkeypatch.setattr(optimizer, "step", lambda *a, **k: calls.append(1) or original(*a, **k))
    teacher = []
    learner.model.teacher_features = lambda x, f=learner.model.teacher_features: teacher.append(1) or f(x)
    x = torch.randn(4, 3, *tiny_vit().patch_embed.img_size)
    learner.step(optimizer, x, learner.labels(experiences - 1, 4, torch.Generator().manual_seed(0)))
    assert len(calls) == steps and len(teacher) == steps - 1


def test_cl_lora_s_inference_runs_its_task_specific_blocks_once_per_experience_learned():
    learner = grown(cl_lora(), 3)
    learner.finish(2)
    model, runs = learner.model.eval(), []
    shared, specific = model.blocks[0], model.blocks[model.num_shared]
    assert model.num_shared == 1 and len(model.blocks) == 2
    shared.attn.qkv.register_forward_hook(lambda *_: runs.append("shared"))
    specific.attn.qkv.register_forward_hook(lambda *_: runs.append("specific"))
    with torch.no_grad():
        logits = model(torch.randn(4, 3, *tiny_vit().patch_embed.img_size))
    assert runs.count("shared") == 1 and runs.count("specific") == 3
    assert bool(logits[:, : 3 * CLASSES].isfinite().all())
