"""SD-LoRA, InfLoRA, LoRA subtraction and CL-LoRA under torchrun: 2 CPU processes (gloo) against one process
on the same data.

One full-experience batch per step (the whole experience in one process, half of it on each
rank): the mean of the ranks' mean gradients (DDP's; CL-LoRA's own, outside DDP) is the one process's
gradient, so the runs take the same steps and must end in the same state, up to the order of float sums.
That holds for a loss that is a mean over samples; LoRA subtraction's triplet loss, whose hardest pairs are
searched over the whole batch, gathers every rank's features first (tests/test_lora_sub_torchrun.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from helpers import stream_metric
from lora_sum_cases import same_state, tiny
from streams import class_stream

DISTRIBUTED_STREAM = dict(num_experiences=2, per_class=8)  # 16 training samples per experience


def distributed_run(strategy_class, train_mb_size: int, plugins=(), device="cpu", **options):
    """Train and evaluate on a 2-experience stream, one full-experience batch per step; ``options``: the
    strategy's, beside the tiny ones."""
    strategy = tiny(strategy_class, train_mb_size=train_mb_size, train_epochs=4, plugins=list(plugins), device=device,
                    **options)
    benchmark = class_stream(**DISTRIBUTED_STREAM)
    for experience in benchmark.train_stream:
        strategy.train(experience)
    return strategy, stream_metric(strategy.eval(benchmark.test_stream), "Top1_Acc")


def check_two_ranks_equal_one_process(strategy_class, tmp_path: Path, **options) -> None:
    """``options`` (JSON values): the strategy's, in both runs."""
    tests = Path(__file__).parent
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(tests.parent), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(tests / "lora_sum_distributed_run.py"), str(tmp_path), strategy_class.__name__, "8",
               json.dumps(options)]
    run = subprocess.run(command, cwd=tests, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    first, second = (torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2))
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
