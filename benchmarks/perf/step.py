"""R1 alone: CoLoR's training step over the frozen-backbone forward, in the shape of ``python -m benchmarks.perf``'s
table (the same model, batch, rank, experts and optimiser), in a minute or two instead of the table's half hour.

    python -m benchmarks.perf.step --rounds 7 --threads 2

It is the check to run when a change may have moved the step, and the way to tell a slower machine from slower
code: run it from two trees on one machine, alternating, and compare. Run as a file (``PYTHONPATH=<tree> python
benchmarks/perf/step.py``) it times the tree on ``PYTHONPATH``, also one whose ``benchmarks.perf`` has no
``step`` module: it needs only that tree's ``build_color`` and timing helpers (so it keeps its own
``CLASSES`` and :func:`color_training_step`, which the table's script imports from here).
"""

from __future__ import annotations

import argparse
from contextlib import nullcontext
from functools import partial
from typing import Callable

import timm
import torch
from torch import nn

import avalanche_color
from benchmarks.perf.timing import Variant, interleaved, per_round, seconds
from benchmarks.perf.workloads import build_color

CLASSES = 10  # per expert, as in the table (benchmarks.perf.workloads)


def color_training_step(model: nn.Module, x: torch.Tensor, labels: torch.Tensor
                        ) -> tuple[Callable[[], None], torch.optim.Optimizer]:
    """CoLoR's training step as every R1 is timed (here and in ``benchmarks.perf``'s table): SGD with momentum on
    the trainable parameters (the newest expert and head), cross-entropy on ``model(x)``; and its optimiser."""
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3, momentum=0.9)
    criterion = nn.CrossEntropyLoss()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        criterion(model(x), labels).backward()
        optimizer.step()

    return step, optimizer


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit_base_patch16_224", help="timm model name (random weights)")
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--rank", type=int, default=64)
    parser.add_argument("--experts", type=int, default=50,
                        help="experts in the model, the last one training (the table's model holds 50)")
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds after one warm-up round")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--bf16", action="store_true", help="run the model under torch.autocast(bfloat16)")
    parser.add_argument("--matmul-precision", choices=("highest", "high", "medium"), default="highest",
                        help="torch.set_float32_matmul_precision: highest (float32), high (TF32 on Ampere and newer GPUs)")
    args = parser.parse_args()
    for name in ("batch_size", "rank", "experts", "k", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.set_float32_matmul_precision(args.matmul_precision)
    precision = (partial(torch.autocast, device.type, dtype=torch.bfloat16) if args.bf16 else nullcontext)
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    vit = timm.create_model(args.model, pretrained=False, num_classes=0)
    model = build_color(vit, args.experts, args.rank, CLASSES, args.k, device)
    x = torch.randn(args.batch_size, 3, *vit.patch_embed.img_size, generator=generator).to(device)
    labels = torch.randint(0, CLASSES, (args.batch_size,), generator=generator) + CLASSES * (args.experts - 1)
    color_step, _ = color_training_step(model, x, labels.to(device))

    def frozen_forward() -> None:
        with torch.no_grad():
            model.features(x)

    rounds = interleaved({"frozen-backbone forward": Variant(frozen_forward, setup=model.eval),
                          "CoLoR training step": Variant(color_step, setup=model.train)}, args.rounds, device,
                         precision)
    r1 = per_round(rounds, lambda t: t["CoLoR training step"] / t["frozen-backbone forward"])
    print(f"code: {avalanche_color.__file__}; {args.model}, batch {args.batch_size}, rank {args.rank}, "
          f"{args.experts} experts, device {device.type}, {torch.get_num_threads()} threads, {args.rounds} rounds, "
          f"{'bf16 autocast' if args.bf16 else 'float32'}, matmul precision {args.matmul_precision}")
    print(f"R1 (CoLoR training step / frozen-backbone forward): {r1.format()}")
    for name in ("frozen-backbone forward", "CoLoR training step"):
        print(f"{name}: {seconds(rounds, name).format(4)} s")


if __name__ == "__main__":
    main()
