"""The memory rows of benchmarks.perf: properties of what a training iteration of each strategy's own ``train`` saves
for backward as experiences accumulate (tiny ViTs, CPU, seconds; nothing timed)."""

from __future__ import annotations

import functools

import pytest
import torch

from benchmarks.perf.__main__ import replace_section
from benchmarks.perf.memory import IterationMemory, Measurement, measure_growth
from benchmarks.perf.strategies import memory_strategies, synthetic_stream
from streams import IMAGE_SIZE, tiny_vit

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore::avalanche_color.ExpertLearnedNothing"),
              pytest.mark.filterwarnings("ignore:No loggers specified")]
CPU = torch.device("cpu")
RANK, CLASSES, K = 4, 2, 3
EARLIER, LATER = 2, 6  # experiences; the LATER - EARLIER components or experts between them bring 8 classes
FLOAT = 4  # bytes
METHODS = ("CoLoR", "SD-LoRA", "InfLoRA", "LoRA-Sub", "CL-LoRA")


def measured(method: str, batch: int, counts: list[int]) -> list[Measurement]:
    """``method``'s strategy through ``max(counts)`` experiences of ``max(batch, K)`` random images, its first
    iteration of each experience in ``counts`` measured (batches of ``batch``)."""
    probe = IterationMemory(CPU)
    strategy = memory_strategies(tiny_vit, RANK, K, batch, CPU, "32-true", lambda _: [probe])[method]()
    stream = synthetic_stream(max(counts), CLASSES, (IMAGE_SIZE, IMAGE_SIZE), [max(batch, K)] * max(counts), batch)
    return measure_growth(strategy, probe, method, counts, stream)


@functools.cache
def growth(method: str) -> tuple[float, float]:
    """How much more autograd saves for backward at experience LATER than at EARLIER: (bytes per sample,
    bytes whatever the batch), from batches of 2 and 8."""
    def saved(batch: int) -> list[int]:
        return [m.step.saved for m in measured(method, batch, [EARLIER, LATER])]

    (small_before, small_after), (large_before, large_after) = saved(2), saved(8)
    per_sample = ((large_after - large_before) - (small_after - small_before)) / 6
    return per_sample, (small_after - small_before) - 2 * per_sample


@pytest.mark.parametrize("method", METHODS)
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


def test_colors_iteration_holds_gradients_of_the_training_expert_alone_and_momentum_for_it():
    # Frozen experts are not in the graph: the gradients (and SGD's momentum) are the new expert's and head's.
    probe = IterationMemory(CPU)
    strategy = memory_strategies(tiny_vit, RANK, K, 4, CPU, "32-true", lambda _: [probe])["CoLoR"]()
    stream = synthetic_stream(3, CLASSES, (IMAGE_SIZE, IMAGE_SIZE), [4] * 3, 4)
    for experience in list(stream.train_stream)[:2]:
        strategy.train(experience)
    probe.measure_next()
    strategy.train(stream.train_stream[2])
    expert = sum(p.nbytes for p in strategy.model.expert_parameters(2))  # its LoRA factors and head
    assert probe.step.gradients == expert == probe.step.optimiser > 0
    assert probe.held > 0 and probe.step.saved > 0
