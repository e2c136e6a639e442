"""One rank of the 2-process SD-LoRA / InfLoRA / LoRA subtraction / CL-LoRA tests (launched by torchrun from
lora_sum_torchrun.py), running every case in turn in one process group.

Usage: torchrun --standalone --nproc_per_node=2 tests/lora_sum_distributed_run.py OUT_DIR TRAIN_MB_SIZE CASES
CASES: a JSON object, each case's name to [METHOD, the strategy's options as a JSON object].
Writes OUT_DIR/CASE/rank{RANK}.pt for each case: the learned state, the stream accuracy and the labels the
metrics saw; and OUT_DIR/gathered-triplet/rank{RANK}.pt: LoRA subtraction's triplet loss over the gathered rows of
unequal batches, with its gradient (test_lora_sub_torchrun.py).
The process group's backend: $AVALANCHE_COLOR_TEST_BACKEND, "gloo" (CPU, the default) or "nccl"
(each rank on cuda:{LOCAL_RANK}).
"""

import json
import os
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)

from avalanche.distributed import DistributedHelper  # noqa: E402

from avalanche_color import CLLoRA, InfLoRA, LoRASubtraction, SDLoRA  # noqa: E402
from avalanche_color.training.distributed import init_distributed  # noqa: E402
from helpers import SeenLabels  # noqa: E402
from lora_sum_torchrun import GATHERED_TRIPLET, TRIPLET_ROWS, distributed_run, triplet_case  # noqa: E402

STRATEGIES = {"SDLoRA": SDLoRA, "InfLoRA": InfLoRA, "LoRASubtraction": LoRASubtraction, "CLLoRA": CLLoRA}


def run_case(out: Path, method: str, train_mb_size: int, options: dict) -> None:
    seen = SeenLabels()
    strategy, accuracy = distributed_run(STRATEGIES[method], train_mb_size, plugins=[seen],
                                         device=DistributedHelper.make_device(), **options)
    out.mkdir(exist_ok=True)
    torch.save({"world_size": DistributedHelper.world_size, "accuracy": accuracy,
                "state": {k: v.cpu() for k, v in strategy.model.experts_state_dict().items()},
                "seen_labels": {exp: torch.cat(batches).cpu() for exp, batches in seen.labels.items()}},
               out / f"rank{DistributedHelper.rank}.pt")


def gathered_triplet(out: Path) -> None:
    """Each rank's rows of triplet_case (TRIPLET_ROWS of them), normalised, gathered padded, and the loss."""
    from avalanche_color.peers.lora_sub.strategy import augmented_triplet_loss
    from avalanche_color.training.distributed import gather_padded_rows

    rank = DistributedHelper.rank
    device = DistributedHelper.make_device()
    features, labels, prototypes, classes = (tensor.to(device) for tensor in triplet_case())
    start = sum(TRIPLET_ROWS[:rank])
    mine = features[start: start + TRIPLET_ROWS[rank]].clone().requires_grad_()
    gathered, real = gather_padded_rows(mine / mine.norm(dim=1, keepdim=True), max(TRIPLET_ROWS))
    all_labels, _ = gather_padded_rows(labels[start: start + TRIPLET_ROWS[rank]], max(TRIPLET_ROWS))
    loss = augmented_triplet_loss(gathered, all_labels, prototypes, classes, margin=1.0, real=real)
    loss.backward()
    out.mkdir(exist_ok=True)
    torch.save({"loss": loss.detach().cpu(), "grad": mine.grad.cpu(), "real": real.cpu()}, out / f"rank{rank}.pt")


def main(out: Path, train_mb_size: int, cases: dict) -> None:
    init_distributed(0, backend=os.environ.get("AVALANCHE_COLOR_TEST_BACKEND", "gloo"))
    assert DistributedHelper.world_size == len(TRIPLET_ROWS)
    gathered_triplet(out / GATHERED_TRIPLET)
    for name, (method, options) in cases.items():
        DistributedHelper.set_random_seeds(0)  # as a launch of this case alone starts
        run_case(out / name, method, train_mb_size, options)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3]))
