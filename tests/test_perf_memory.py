"""The memory rows of benchmarks.perf: properties of what a training step saves for backward as experiences
accumulate (tiny ViTs, CPU, seconds; nothing timed)."""

from __future__ import annotations

import functools
from contextlib import nullcontext

import pytest
import torch

from avalanche_color import ExpertViT, InfLoRAConfig, InfLoRAViT, SDLoRAConfig, SDLoRAViT
from benchmarks.perf.learners import CoLoRLearner, InfLoRALearner, SDLoRALearner
from benchmarks.perf.memory_growth import measure_growth
from benchmarks.perf.report import replace_section
from streams import tiny_vit

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")
RANK, CLASSES = 4, 2
EARLIER, LATER = 2, 6  # experiences; the LATER - EARLIER components or experts between them bring 8 classes
FLOAT = 4  # bytes


def inf_lora() -> InfLoRALearner:
    vit = tiny_vit()
    return InfLoRALearner(InfLoRAViT(vit, InfLoRAConfig(rank=RANK)), CLASSES, tuple(vit.patch_embed.img_size))


LEARNERS = {
    "CoLoR": lambda: CoLoRLearner(ExpertViT(tiny_vit(), rank=RANK), CLASSES, k=3),
    "SD-LoRA": lambda: SDLoRALearner(SDLoRAViT(tiny_vit(), SDLoRAConfig(rank=RANK)), CLASSES),
    "InfLoRA": inf_lora,
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
    # (CoLoR) and frozen components are folded into the weight (SD-LoRA, InfLoRA).
    per_sample, _ = growth(method)
    new_classes = (LATER - EARLIER) * CLASSES
    assert 0 < per_sample <= 2 * new_classes * FLOAT


def test_what_grows_whatever_the_batch_is_sd_lora_s_folded_directions_only():
    # SD-LoRA's earlier magnitudes learn, so the fold keeps each frozen direction's A (concatenated) for
    # their gradients; InfLoRA's fold trains nothing and CoLoR's frozen experts are not in the graph.
    width, depth = tiny_vit().embed_dim, len(tiny_vit().blocks)
    one_factor = RANK * width * FLOAT
    assert growth("CoLoR")[1] < one_factor
    assert growth("InfLoRA")[1] < one_factor
    assert growth("SD-LoRA")[1] >= (LATER - EARLIER) * 2 * depth * one_factor


def test_a_section_replaces_its_namesake_and_keeps_the_rest():
    text = "# perf\n\ntable\n\n## Memory\n\nold\n\n## Later\n\nkept\n"
    replaced = replace_section(text, "## Memory\n\nnew\n")
    assert replaced == "# perf\n\ntable\n\n## Memory\n\nnew\n\n## Later\n\nkept\n"
    assert replace_section(replaced, "## Memory\n\nnew\n") == replaced
    assert replace_section("table\n", "## Memory\n\nnew") == "table\n\n## Memory\n\nnew\n"
