"""One rank of the 2-process CoLoR tests (launched by torchrun from test_distributed.py), running the cases
named in turn in one process group (starting the processes takes longer than a case).

Usage: torchrun --standalone --nproc_per_node=N tests/distributed_run.py OUT_DIR TRAIN_MB_SIZE ROUTER_WIDTH CASE...
       [-- RUNNER_ARGUMENTS...]
CASE: ``prototypes`` or ``ridge``, tiny CoLoR with that router trained and evaluated on class_stream; writes
OUT_DIR/CASE/rank{RANK}.pt: prototypes, class-router state (ridge), stream accuracy and the labels each
evaluation experience's metrics saw. Or ``collectives`` (collectives_run.py, gloo only):
OUT_DIR/collectives/rank{RANK}.pt.
RUNNER_ARGUMENTS: after the cases, the ranks run ``python -m avalanche_color.runner RUNNER_ARGUMENTS`` as
torchrun would start it, the runner starting its own process group (on a new port: a process group cannot start
again on the one torchrun gave).
The process group's backend: $AVALANCHE_COLOR_TEST_BACKEND, "gloo" (CPU, the default) or "nccl"
(each rank on cuda:{LOCAL_RANK}).
"""

import os
import runpy
import socket
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)

from avalanche.distributed import DistributedHelper  # noqa: E402

from avalanche_color.training.distributed import communication_device, init_distributed  # noqa: E402
from collectives_run import collectives  # noqa: E402
from helpers import UNSATURATED, SeenLabels, stream_metric, tiny_color, train_all  # noqa: E402
from streams import class_stream  # noqa: E402


def color_case(out: Path, train_mb_size: int, router_kind: str, router_width: int, device: torch.device) -> None:
    seen = SeenLabels()
    strategy = tiny_color(train_mb_size=train_mb_size, plugins=[seen], router=router_kind, router_width=router_width,
                          device=device, **UNSATURATED)
    router = strategy.model.router
    results = train_all(strategy, class_stream())
    out.mkdir(exist_ok=True)
    torch.save(
        {
            "world_size": DistributedHelper.world_size,
            "prototypes": router.prototypes.cpu() if router_kind == "prototypes" else None,
            "owners": router.owners.cpu() if router_kind == "prototypes" else None,
            "class_router": {k: v.cpu() for k, v in router.state_dict().items()} if router_kind != "prototypes" else None,
            "accuracy": stream_metric(results, "Top1_Acc"),
            "routing_accuracy": stream_metric(results, "RoutingAcc"),
            "seen_labels": {exp: torch.cat(batches).cpu() for exp, batches in seen.labels.items()},
            "device": str(device),
        },
        out / f"rank{DistributedHelper.rank}.pt",
    )


def free_port_on_every_rank() -> int:
    """A port free on rank 0's host, chosen there and broadcast (a tensor) to every rank."""
    port = torch.zeros(1, dtype=torch.int64, device=communication_device())
    if DistributedHelper.rank == 0:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port[0] = probe.getsockname()[1]
    torch.distributed.broadcast(port, 0)
    return int(port[0])


def run_the_runner(arguments: list[str]) -> None:
    """``python -m avalanche_color.runner ARGUMENTS`` in this rank, after its process group has gone."""
    sys.argv = ["avalanche_color.runner", *arguments]
    runpy.run_module("avalanche_color.runner", run_name="__main__", alter_sys=True)


def main(out: Path, train_mb_size: int, router_width: int, cases: list[str], runner: list[str]) -> None:
    device = init_distributed(0, backend=os.environ.get("AVALANCHE_COLOR_TEST_BACKEND", "gloo"))
    for case in cases:
        if case == "collectives":
            collectives(out / case, device)
        else:
            DistributedHelper.set_random_seeds(0)  # as a launch of this case alone starts
            color_case(out / case, train_mb_size, case, router_width, device)
    port = free_port_on_every_rank() if runner else None
    torch.distributed.destroy_process_group()
    if runner:  # its process group: a store of rank 0's on the new port, not torchrun's
        os.environ.update(MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="False")
        run_the_runner(runner)


if __name__ == "__main__":
    arguments = sys.argv[4:]
    split = arguments.index("--") if "--" in arguments else len(arguments)
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), arguments[:split], arguments[split + 1:])
