"""One rank of the 2-process CoLoR test (launched by torchrun from test_distributed.py).

Usage: torchrun --standalone --nproc_per_node=N tests/distributed_run.py OUT_DIR TRAIN_MB_SIZE [ROUTER ROUTER_WIDTH]
Writes OUT_DIR/rank{RANK}.pt: prototypes, class-router state (with a ROUTER other than
prototypes), stream accuracy and the labels each evaluation experience's metrics saw.
The process group's backend: $AVALANCHE_COLOR_TEST_BACKEND, "gloo" (CPU, the default) or "nccl"
(each rank on cuda:{LOCAL_RANK}).
"""

import os
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)

from avalanche.distributed import DistributedHelper  # noqa: E402

from avalanche_color.training.distributed import init_distributed  # noqa: E402
from helpers import UNSATURATED, SeenLabels, stream_metric, tiny_color, train_all  # noqa: E402
from streams import class_stream  # noqa: E402


def main(out: Path, train_mb_size: int, router_kind: str, router_width: int) -> None:
    device = init_distributed(0, backend=os.environ.get("AVALANCHE_COLOR_TEST_BACKEND", "gloo"))
    seen = SeenLabels()
    strategy = tiny_color(train_mb_size=train_mb_size, plugins=[seen], router=router_kind, router_width=router_width,
                          device=device, **UNSATURATED)
    router = strategy.model.router
    results = train_all(strategy, class_stream())
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
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    router, width = sys.argv[3:5] if len(sys.argv) > 4 else ("prototypes", "2048")
    main(Path(sys.argv[1]), int(sys.argv[2]), router, int(width))
