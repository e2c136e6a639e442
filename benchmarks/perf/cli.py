"""Speed and memory of CoLoR's training and routed inference, as ratios measured side by side.

    python -m benchmarks.perf                      # ViT-B/16 shape, CPU (CUDA when present)
    python -m benchmarks.perf --device cuda --batch-size 64 --bf16 --out benchmarks/results/perf-cuda.md
    python -m benchmarks.perf --only memory        # only the memory-growth section, replaced in --out
    python -m benchmarks.perf --only kernels       # only the mixed-expert kernels section (benchmarks.perf.kernels)

Everything runs in this one process on the same inputs. Timings are
interleaved: after a warm-up round, each of ``--rounds`` rounds runs every
timed call once, in an order rotated by one place per round, and every ratio is
computed within a round from that round's timings. Figures are the median over
rounds with the min and max. Weights are random (timings do not depend on them).
Printed and written as a markdown table:

* R1 = CoLoR training step / frozen-backbone forward (ideal about 2.0)
* R2 = CoLoR training step / full fine-tuning step, and their training memory
* R3 = routed inference throughput / plain ViT forward throughput (ideal 0.5)
* R4 = routed inference time with 10 experts mixed in each batch / with 1 expert (ideal 1.0)
* R5 = our expert pass / peft's mixed-adapter pass (``adapter_names``), 10 experts in a batch
* R5 overhead = (our expert pass - plain forward) / (peft's mixed-adapter pass - plain forward),
  for 1, 2, 10 and 50 experts in one batch (``--mixed-batch-size`` samples, 50 by default)
* routing (nearest prototype) and k-means fit time as a share of a forward
* the class-level routers (ridge, gaussian): routing and fitting time as a share of a forward
* SD-LoRA, InfLoRA, LoRA-Sub and CL-LoRA (``--experts`` experiences learned, the last one training): their
  training step / frozen-backbone forward, and their inference throughput / CoLoR's routed inference
  throughput (one forward and no router against two passes; CL-LoRA's task-specific blocks run once per
  experience). Each step is its strategy's: LoRA-Sub's projected Adam (the projection active, as from the
  second experience on) on the cross-entropy plus the triplet loss, and its prediction by the nearest class
  mean; CL-LoRA's SGD, its teacher's forward, two gradients and two SGD steps per batch. SD-LoRA's and
  InfLoRA's step here: SGD with momentum
* loader / step = images per second of a training data loader (JPEG photos decoded, RandomResizedCrop,
  flip, normalise, with ``--loader-workers`` worker processes) / images per second of the CoLoR
  training step: below 1 the accelerator waits for the data
* training memory against experiences learned (``--memory-experiences``, 1, 10 and 50 by default), on
  ``--memory-model`` (ViT-S/16 by default: 50 InfLoRA experiences take minutes on a CPU): for CoLoR, S-Prompts,
  L2P, SD-LoRA, InfLoRA, LoRA-Sub and CL-LoRA, the learned state plus one training step of experience t, and
  the state stored after it (:mod:`benchmarks.perf.memory_growth`); a section of its own, which ``--only
  memory`` measures alone and replaces in ``--out``
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

RESULTS = Path(__file__).parents[1] / "results"


def parse_args() -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit_base_patch16_224", help="timm model name (random weights)")
    parser.add_argument("--batch-size", type=int, default=10, help="at least --experts: one sample per expert")
    parser.add_argument("--rank", type=int, default=64)
    parser.add_argument("--experts", type=int, default=10, help="experts mixed in a batch for R3, R4 and R5")
    parser.add_argument("--mixed-experts", default="1,2,10,50",
                        help="comma-separated numbers of experts in one batch for the R5 overhead rows ('' for none)")
    parser.add_argument("--mixed-batch-size", type=int, default=None,
                        help="batch of the R5 rows (default: the largest of --mixed-experts, at least --batch-size)")
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds after one warm-up round")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--bf16", action="store_true", help="run the models under torch.autocast(bfloat16)")
    parser.add_argument("--matmul-precision", choices=("highest", "high", "medium"), default="highest",
                        help="torch.set_float32_matmul_precision: highest (float32), high (TF32 on Ampere and newer GPUs)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument("--loader-workers", default="0,2",
                        help="comma-separated DataLoader worker counts for the loader rows ('' for none)")
    parser.add_argument("--loader-batches", type=int, default=8,
                        help="batches (of --batch-size) per timed loader epoch")
    parser.add_argument("--memory-experiences", default="1,10,50",
                        help="comma-separated numbers of experiences learned for the memory rows ('' for none)")
    parser.add_argument("--memory-model", default="vit_small_patch16_224",
                        help="timm model name of the memory rows (random weights)")
    parser.add_argument("--only", choices=("memory", "kernels"), default=None,
                        help="'memory': only the memory rows; 'kernels': only the two mixed-expert kernels side by "
                             "side (R3, R4, expert-pass overhead, operators per forward); their section replaced in "
                             "--out (the rest kept)")
    parser.add_argument("--out", type=Path, default=RESULTS / "perf.md")
    return parser, parser.parse_args()
