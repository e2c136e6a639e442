"""The tensor collectives' case of the 2-process test (test_distributed.py), on gloo: run by the ranks of
distributed_run.py (its case ``collectives``), or alone.

Usage: torchrun --standalone --nproc_per_node=2 tests/collectives_run.py OUT_DIR
Runs the package's tensor collectives with rows of different counts (one rank's empty) and counts
any pickling collective; writes OUT_DIR/rank{RANK}.pt.
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from avalanche_color.training.distributed import broadcast_tensor, gather_rows, init_distributed

PICKLED = {"count": 0}
for name in ("broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list"):
    original = getattr(dist, name)

    def counting(*args, _original=original, **kwargs):
        PICKLED["count"] += 1
        return _original(*args, **kwargs)

    setattr(dist, name, counting)


def collectives(out: Path, device: torch.device) -> None:
    """The case, in a gloo process group already started; counts the pickling collectives it makes."""
    PICKLED["count"] = 0
    rank = dist.get_rank()
    rows = torch.arange(5 * 4, dtype=torch.float32).reshape(5, 4)
    mine = rows[:3] if rank == 0 else rows[3:]
    empty_then_rows = torch.empty(0, dtype=torch.int64) if rank == 0 else torch.tensor([7, 8])
    generator = torch.Generator().manual_seed(rank)
    result = {
        "gathered": gather_rows(mine),
        "empty_then_rows": gather_rows(empty_then_rows),
        "bf16": broadcast_tensor(torch.randn(3, 2, generator=generator).to(torch.bfloat16) if rank == 0 else None,
                                 device),
    }
    broadcast = broadcast_tensor(torch.arange(24, dtype=torch.float64).reshape(2, 3, 4) if rank == 0 else None, device)
    result.update(broadcast=broadcast, broadcast_dtype=broadcast.dtype, pickled=PICKLED["count"])
    out.mkdir(exist_ok=True)
    torch.save(result, out / f"rank{rank}.pt")


def main(out: Path) -> None:
    device = init_distributed(0, backend="gloo")
    collectives(out, device)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
