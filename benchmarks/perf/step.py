"""R1 alone: CoLoR's training iteration over the frozen-backbone forward, in the shape of ``python -m
benchmarks.perf``'s table (the same model, batch, rank, experiences and strategy), in a few minutes instead of the
table's quarter hour or more.

    python -m benchmarks.perf.step --rounds 7 --threads 2

It is the check to run when a change may have moved the step, and the way to tell a slower machine from slower
code: run it from two trees on one machine, alternating, and compare (``PYTHONPATH=<tree> python
benchmarks/perf/step.py`` times the tree on ``PYTHONPATH``). As in the table, the iteration is CoLoR's own
(:mod:`benchmarks.perf.strategies`): the strategy trained by its ``train`` on ``--experts`` - 1 experiences of the
synthetic stream, then one iteration of its ``train`` of the last experience per round.
"""

from __future__ import annotations

import argparse
import warnings
from contextlib import nullcontext
from functools import partial

import torch

import avalanche_color
from avalanche_color import ExpertLearnedNothing, ExpertViT
from benchmarks.perf.strategies import Clock, TrainingTurns, grown, strategies, synthetic_stream, timm_vit, training_variant
from benchmarks.perf.timing import Variant, interleaved, per_round, seconds
from benchmarks.perf.workloads import CLASSES

WARMUP_ROUNDS = 1


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit_base_patch16_224", help="timm model name (random weights)")
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--rank", type=int, default=64)
    parser.add_argument("--experts", type=int, default=10,
                        help="experiences, the last one training (the table's --experts); the others are trained first")
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
    warnings.filterwarnings("ignore", category=ExpertLearnedNothing)  # random images: nothing is learned
    warnings.filterwarnings("ignore", message="No loggers specified")
    make_vit = timm_vit(args.model)
    vit = make_vit()
    size = tuple(vit.patch_embed.img_size)
    frozen = ExpertViT(vit, rank=args.rank).to(device).eval()  # the same ViT's features, no expert
    x = torch.randn(args.batch_size, 3, *size, generator=torch.Generator().manual_seed(0)).to(device)
    batches = 1 + WARMUP_ROUNDS + args.rounds
    stream = synthetic_stream(args.experts, CLASSES, size, [max(args.batch_size, args.k)] * (args.experts - 1)
                              + [batches * args.batch_size], args.batch_size)
    clock = Clock(device)
    strategy = strategies(make_vit, args.rank, args.k, args.batch_size, device, "bf16-mixed" if args.bf16 else
                          "32-true", CLASSES * args.experts, lambda name: [clock])["CoLoR"]()
    turns = TrainingTurns(grown(strategy, stream), stream.train_stream[args.experts - 1], clock).start()

    def frozen_forward() -> None:
        with torch.no_grad():
            frozen.features(x)

    rounds = interleaved({"frozen-backbone forward": Variant(frozen_forward),
                          "CoLoR training step": training_variant(turns)}, args.rounds, device, precision,
                         warmup_rounds=WARMUP_ROUNDS)
    turns.close()
    r1 = per_round(rounds, lambda t: t["CoLoR training step"] / t["frozen-backbone forward"])
    print(f"code: {avalanche_color.__file__}; {args.model}, batch {args.batch_size}, rank {args.rank}, "
          f"{args.experts} experiences, device {device.type}, {torch.get_num_threads()} threads, {args.rounds} rounds, "
          f"{'bf16 autocast' if args.bf16 else 'float32'}, matmul precision {args.matmul_precision}")
    print(f"R1 (CoLoR training iteration / frozen-backbone forward): {r1.format()}")
    for name in ("frozen-backbone forward", "CoLoR training step"):
        print(f"{name}: {seconds(rounds, name).format(4)} s")


if __name__ == "__main__":
    main()
