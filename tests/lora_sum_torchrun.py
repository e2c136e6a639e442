"""SD-LoRA, InfLoRA, LoRA subtraction and CL-LoRA under torchrun: 2 CPU processes (gloo) against one process
on the same data.

One full-experience batch per step (the whole experience in one process, half of it on each
rank): the mean of the ranks' mean gradients (DDP's; CL-LoRA's own, outside DDP) is the one process's
gradient, so the runs take the same steps and must end in the same state, up to the order of float sums.
That holds for a loss that is a mean over samples; LoRA subtraction's triplet loss, whose hardest pairs are
searched over the whole batch, gathers every rank's features first (tests/test_lora_sub_torchrun.py).

Every case runs in one torchrun launch (the ranks run them in turn, each into its own subfolder): starting two
processes that import torch and Avalanche takes longer than a case. The launch runs once per test session, whichever
test asks first (under pytest-xdist the workers share it through a file lock); each test then compares its case's
ranks with its own one-process run.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from helpers import once_per_session, run_torchrun, stream_metric
from lora_sum_cases import same_state, tiny
from streams import class_stream

DISTRIBUTED_STREAM = dict(num_experiences=2, per_class=8)  # 16 training samples per experience
# The launch's cases: a method and its options (JSON values), in both runs.
CASES = {"SDLoRA": ("SDLoRA", {}), "InfLoRA": ("InfLoRA", {}), "LoRASubtraction": ("LoRASubtraction", {}),
         "LoRASubtraction-no-triplet": ("LoRASubtraction", {"triplet_weight": 0.0}), "CLLoRA": ("CLLoRA", {})}
GATHERED_TRIPLET = "gathered-triplet"  # and test_lora_sub_torchrun's triplet loss over unequal gathered batches
TRIPLET_ROWS = (3, 5)  # each rank's batch there: unequal, so the gather pads rank 0's


def triplet_case():
    """Features, labels, prototypes and prototype classes of the gathered triplet loss case (all ranks' rows)."""
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(sum(TRIPLET_ROWS), 6, generator=generator, dtype=torch.float64)
    labels = torch.tensor([0, 1, 0, 2, 1, 1, 0, 2])
    prototypes = torch.randn(2, 6, generator=generator, dtype=torch.float64)
    return features, labels, prototypes, torch.tensor([0, 3])


def case_name(strategy_class, options: dict) -> str:
    for name, (method, case_options) in CASES.items():
        if method == strategy_class.__name__ and case_options == options:
            return name
    raise KeyError(f"no torchrun case runs {strategy_class.__name__} with {options}: add it to CASES")


def two_rank_outputs(tmp_path_factory) -> Path:
    """The folder of the one torchrun launch's outputs, ``<case>/rank{0,1}.pt``: launched by the first test of
    the session that asks, read by every later one (a failed launch fails every case)."""
    return once_per_session(tmp_path_factory, "lora_torchrun", lambda out: run_torchrun(
        "lora_sum_distributed_run.py", str(out), "8", json.dumps(CASES), timeout=900))


def distributed_run(strategy_class, train_mb_size: int, plugins=(), device="cpu", **options):
    """Train and evaluate on a 2-experience stream, one full-experience batch per step; ``options``: the
    strategy's, beside the tiny ones."""
    strategy = tiny(strategy_class, train_mb_size=train_mb_size, train_epochs=4, plugins=list(plugins), device=device,
                    **options)
    benchmark = class_stream(**DISTRIBUTED_STREAM)
    for experience in benchmark.train_stream:
        strategy.train(experience)
    return strategy, stream_metric(strategy.eval(benchmark.test_stream), "Top1_Acc")


def check_two_ranks_equal_one_process(strategy_class, tmp_path_factory, **options) -> None:
    """The 2 ranks of the launch's case for ``strategy_class`` with ``options`` (JSON values; the strategy's,
    in both runs) against one process."""
    case = two_rank_outputs(tmp_path_factory) / case_name(strategy_class, options)
    first, second = (torch.load(case / f"rank{rank}.pt") for rank in range(2))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single, accuracy = distributed_run(strategy_class, 16, **options)
    finally:
        torch.set_num_threads(threads)
    assert first["world_size"] == 2 and first["accuracy"] == second["accuracy"]
    same_state(first["state"], second["state"])  # DDP kept the ranks in step
    expected = single.model.experts_state_dict()
    assert first["state"].keys() == expected.keys()
    for key, value in expected.items():  # the same steps; float sums in another order
        torch.testing.assert_close(first["state"][key].to(value.dtype), value, rtol=1e-3, atol=2e-4, msg=key)
    assert first["accuracy"] == accuracy and 0.3 < accuracy
    for experience in class_stream(**DISTRIBUTED_STREAM).test_stream:  # every test sample once, in order
        expected_labels = torch.as_tensor(experience.dataset.targets)
        assert torch.equal(first["seen_labels"][experience.current_experience], expected_labels)
