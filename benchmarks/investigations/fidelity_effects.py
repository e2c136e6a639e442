"""The measured effect of each difference between a method and its authors' code, one at a time.

    python -m benchmarks.investigations.fidelity_effects --method SD-LoRA --benchmark digits_class --seeds 0 1 2 \
        --epochs 5 --batch-size 32 --rank 16

Trains the method as the package ships it (its authors' code's behaviour; for L2P, Avalanche's
port's) and once per variant that restores one other reading (the paper's, the authors' code's, or
this package's earlier one), on the runner's streams and backbone, each seed, on one thread; prints
average accuracy and forgetting after the last experience (mean ± std over seeds). The docs'
fidelity page quotes these tables.
"""

from __future__ import annotations

import argparse
import copy
import warnings
from typing import Any

import torch
from avalanche.training.determinism.rng_manager import RNGManager

from avalanche_color import L2P, CLLoRA, InfLoRA, LoRASubtraction, SDLoRA, SPrompts, train_stream
from avalanche_color.benchmarks.registry import benchmark_spec
from avalanche_color.runner.backbone_loading import load_backbone, with_head
from avalanche_color.runner.config import RunConfig
from avalanche_color.runner.methods import L2P_OPTIONS
from avalanche_color.runner.report import forgetting, mean_and_spread, weighted_mean
from avalanche_color.runner.run import EVAL_BATCH, accuracy_matrix, build_stream, evaluator

PAPERS_SD_LORA = dict(direction_norm="product", normalise_when="finish", earlier_magnitudes="keep")
L2P_CODE = dict(grad_clip_norm=1.0, batchwise_selection="always", lr_batch_scaling=True)
VARIANTS: dict[str, tuple[type, dict[str, dict[str, Any]]]] = {
    "SD-LoRA": (SDLoRA, {
        "as its code (default)": {},
        "norm ||BA|| (paper)": dict(direction_norm="product"),
        "normalised when finished": dict(normalise_when="finish"),
        "earlier magnitudes kept": dict(earlier_magnitudes="keep"),
        "lr 0.05 (runner's before)": dict(lr=0.05),
        "head as nn.Linear": dict(head_init="linear"),
        "all five (shipped before)": dict(PAPERS_SD_LORA, head_init="linear", lr=0.05),
    }),
    "InfLoRA": (InfLoRA, {
        "runner's (lr 5e-3, cosine per step)": {},
        "epoch cosine (its code)": dict(lr_schedule="epoch_cosine"),
        "lr 5e-4 (its code)": dict(lr=5e-4),
        "both (its code)": dict(lr=5e-4, lr_schedule="epoch_cosine"),
    }),
    "S-Prompts": (SPrompts, {
        "L1 routing (its code, default)": {},
        "Euclidean routing (CoLoR's)": dict(distance="euclidean"),
        "cosine per epoch (its code)": dict(lr_schedule="epoch_cosine"),
    }),
    "L2P": (L2P, {
        "as Avalanche's port (default)": {},
        "grad norm clipped at 1.0 (code)": dict(grad_clip_norm=1.0),
        "batchwise prompts, training and evaluation (code)": dict(batchwise_selection="always"),
        "batchwise prompts, training only": dict(batchwise_selection="training"),
        "lr x batch / 256 (code)": dict(lr_batch_scaling=True),
        "all three (code)": L2P_CODE,
        "prompts start at zero (keys U[-1, 1])": dict(prompt_init="zero"),
        "prompts and keys U[0, 0.01) (code)": dict(prompt_init="code"),
        "head at zero, untrained classes at 0 (code)": dict(head_init="zero"),
    }),
    "LoRA-Sub": (LoRASubtraction, {
        "as its code (default)": {},
        "own class's earlier prototypes not negatives": dict(same_class_prototypes="exclude"),
        "no projection (threshold 1.0)": dict(threshold=1.0),
        "no triplet loss": dict(triplet_weight=0.0),
    }),
    "CL-LoRA": (CLLoRA, {
        "as its code (default)": {},
        "no distillation of the shared adapters": dict(kd_weight=0.0),
        "no orthogonality of the block weights": dict(ortho_weight=0.0),
        "no shared adapters (every block per experience)": dict(shared_blocks=0),
        "step 2's gradient after step 1 (the code's order)": dict(second_step_gradient="after_step_one"),
    }),
}
SHARED = {"SD-LoRA": lambda config: {}, "InfLoRA": lambda config: dict(lr=5e-3), "LoRA-Sub": lambda config: {},
          "CL-LoRA": lambda config: {},
          "S-Prompts": lambda config: dict(lr=config.color_lr, prompt_length=10),
          "L2P": lambda config: dict(L2P_OPTIONS)}  # the runner's: pool 10, length 5, top_n 5, lr 0.03


def run_variant(strategy_class: type, options: dict[str, Any], config: RunConfig, seed: int) -> tuple[float, float]:
    spec = benchmark_spec(config.benchmark)
    backbone = load_backbone(config.backbone or spec.backbone)
    benchmark = build_stream(spec, config, backbone, seed, task_labels=False)
    RNGManager.set_random_seeds(seed)
    own = ({"rank": config.ranks[0]} if strategy_class in (SDLoRA, InfLoRA, LoRASubtraction, CLLoRA) else
           {} if strategy_class is L2P else {"k": (config.ks or (spec.k,))[0]})
    if strategy_class is InfLoRA:
        own["num_experiences"] = len(benchmark.train_stream)
    strategy = strategy_class(with_head(copy.deepcopy(backbone), 0), **own, **options,
                              train_mb_size=config.batch_size, train_epochs=config.epochs, eval_mb_size=EVAL_BATCH,
                              evaluator=evaluator())
    count = len(benchmark.test_stream)
    matrix = accuracy_matrix(train_stream(strategy, benchmark), count)
    sizes = [len(experience.dataset) for experience in benchmark.test_stream]
    return weighted_mean(matrix[-1], sizes), forgetting(matrix)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--method", choices=sorted(VARIANTS), required=True)
    parser.add_argument("--benchmark", default="digits_class")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--k", type=int, default=None)
    parser.add_argument("--data", default=None)
    parser.add_argument("--variants", nargs="+", default=None,
                        help="run only the variants whose names start with these (default: every variant)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", "No loggers specified")
    config = RunConfig(benchmark=args.benchmark, epochs=args.epochs, batch_size=args.batch_size,
                       ranks=(args.rank,), ks=None if args.k is None else (args.k,), data=args.data)
    strategy_class, variants = VARIANTS[args.method]
    print(f"{args.method} on {args.benchmark}, {args.epochs} epochs, batch {args.batch_size}, seeds {args.seeds}\n")
    print("| variant | average accuracy | forgetting |\n|---|---|---|")
    for name, options in variants.items():
        if args.variants and not any(name.startswith(prefix) for prefix in args.variants):
            continue
        results = [run_variant(strategy_class, {**SHARED[args.method](config), **options}, config, seed)
                   for seed in args.seeds]
        accuracy = mean_and_spread([a for a, _ in results])
        forgot = mean_and_spread([f for _, f in results])
        print(f"| {name} | {accuracy} | {forgot} |", flush=True)


if __name__ == "__main__":
    main()
