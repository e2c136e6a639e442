"""The main job: CoLoR against Avalanche's Naive, EWC, LwF and Replay on offline digit streams.

    python -m benchmarks.compare_digits

Runs in a few minutes on 2 CPU cores, needs no download, and prints (and writes
to benchmarks/results/digits.md and .json) the average accuracy and forgetting
of each method on a class-incremental and a domain-incremental stream.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import torch
from tqdm import tqdm

from benchmarks.streams.digits import (NUM_CLASSES, class_incremental_stream, digits_split,
                               domain_incremental_stream, pretrained_vit, small_vit)
from benchmarks.compare.methods import (BASELINES, Budget, Hyperparameters, build_strategy,
                                trainable_parameters_per_experience)

METHODS = ("CoLoR", *BASELINES)

RESULTS = Path(__file__).parent / "results"


def final_metric(results: dict[str, float], prefix: str) -> float:
    """A stream-level metric from Avalanche's last evaluation (named after the last task)."""
    [value] = [v for k, v in results.items() if k.startswith(prefix + "/eval_phase/test_stream")]
    return value


def accuracy_row(results: dict[str, float], count: int) -> list[float]:
    return [results[f"Top1_Acc_Exp/eval_phase/test_stream/Task000/Exp{i:03d}"] for i in range(count)]


def run(method: str, benchmark, backbone, budget: Budget, hp: Hyperparameters, progress: tqdm) -> dict:
    strategy = build_strategy(method, backbone, NUM_CLASSES, budget, hp)
    count = len(benchmark.train_stream)
    matrix = []
    start = time.perf_counter()
    for experience in benchmark.train_stream:
        strategy.train(experience)
        results = strategy.eval(benchmark.test_stream)
        matrix.append(accuracy_row(results, count))
        progress.update()
    summary = {
        "average_accuracy": final_metric(results, "Top1_Acc_Stream"),
        "forgetting": final_metric(results, "StreamForgetting"),
        "accuracy_matrix": matrix,
        "seconds": time.perf_counter() - start,
    }
    if method == "CoLoR":
        summary["routing_accuracy"] = final_metric(results, "RoutingAcc_Stream")
    summary["trainable_parameters_per_experience"] = trainable_parameters_per_experience(strategy)
    return summary


def markdown(table: dict[str, dict[str, dict]], streams: list[str]) -> str:
    columns = ("avg acc", "forgetting", "routing acc")
    header = "| method | " + " | ".join(f"{s} {c}" for s in streams for c in columns) + " | trainable params / exp |"
    lines = [header, "|" + "---|" * (len(columns) * len(streams) + 2)]
    for method, by_stream in table.items():
        cells = []
        for stream in streams:
            r = by_stream[stream]
            routing = f"{100 * r['routing_accuracy']:.1f}" if "routing_accuracy" in r else "-"
            cells += [f"{100 * r['average_accuracy']:.1f}", f"{100 * r['forgetting']:.1f}", routing]
        params = next(iter(by_stream.values()))["trainable_parameters_per_experience"]
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {params:,} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--epochs", type=int, default=Budget.epochs)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "digits")
    args = parser.parse_args()
    # Avalanche's notice, not about this run: this script does the logging itself.
    warnings.filterwarnings("ignore", message="No loggers specified")

    torch.manual_seed(args.seed)
    budget = Budget(epochs=args.epochs)
    hp = Hyperparameters()
    split = digits_split(args.seed)
    state = pretrained_vit(split, RESULTS / "cache" / f"digits_vit_seed{args.seed}.pt", seed=args.seed)

    def backbone(num_classes: int):
        model = small_vit(num_classes, seed=args.seed)
        model.load_state_dict(state, strict=False)  # the head (if any) stays freshly initialised
        return model

    streams = {
        "class-incremental": class_incremental_stream(split),
        "domain-incremental": domain_incremental_stream(split),
    }
    total = len(args.methods) * sum(len(b.train_stream) for b in streams.values())
    table: dict[str, dict[str, dict]] = {m: {} for m in args.methods}
    with tqdm(total=total, desc="experiences trained", unit="exp") as progress:
        for stream_name, benchmark in streams.items():
            for method in args.methods:
                progress.set_postfix_str(f"{stream_name}: {method}")
                torch.manual_seed(args.seed)
                table[method][stream_name] = run(method, benchmark, backbone, budget, hp, progress)

    report = markdown(table, list(streams))
    command = "python -m benchmarks.compare_digits" + (f" --epochs {args.epochs}" if args.epochs != Budget.epochs else "")
    print("\nAverage accuracy and forgetting (%) after the last experience, digits streams, "
          f"seed {args.seed}, {budget.epochs} epochs per experience:\n")
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(f"`{command}`\n\n{report}\n")
    args.out.with_suffix(".json").write_text(json.dumps(
        {"command": command, "budget": vars(budget), "hyperparameters": vars(hp), "results": table}, indent=2))
    print(f"\nwritten to {args.out.with_suffix('.md')} and .json")


if __name__ == "__main__":
    main()
