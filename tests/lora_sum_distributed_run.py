"""One rank of the 2-process SD-LoRA / InfLoRA / LoRA subtraction / CL-LoRA test (launched by torchrun from
lora_sum_torchrun.py).

Usage: torchrun --standalone --nproc_per_node=2 tests/lora_sum_distributed_run.py OUT_DIR METHOD TRAIN_MB_SIZE [OPTIONS]
OPTIONS: the strategy's options as a JSON object (none by default).
Writes OUT_DIR/rank{RANK}.pt: the learned state, the stream accuracy and the labels the metrics saw.
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
from lora_sum_torchrun import distributed_run  # noqa: E402

STRATEGIES = {"SDLoRA": SDLoRA, "InfLoRA": InfLoRA, "LoRASubtraction": LoRASubtraction, "CLLoRA": CLLoRA}


def main(out: Path, method: str, train_mb_size: int, options: dict) -> None:
    device = init_distributed(0, backend=os.environ.get("AVALANCHE_COLOR_TEST_BACKEND", "gloo"))
    seen = SeenLabels()
    strategy, accuracy = distributed_run(STRATEGIES[method], train_mb_size, plugins=[seen], device=device, **options)
    torch.save({"world_size": DistributedHelper.world_size, "accuracy": accuracy,
                "state": {k: v.cpu() for k, v in strategy.model.experts_state_dict().items()},
                "seen_labels": {exp: torch.cat(batches).cpu() for exp, batches in seen.labels.items()}},
               out / f"rank{DistributedHelper.rank}.pt")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4]) if len(sys.argv) > 4 else {})
