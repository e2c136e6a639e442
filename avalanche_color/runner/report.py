"""The summary of a comparison's runs: metrics from the accuracy matrix, the table, CSV files and the plot, and
the files a finished comparison writes (:func:`write_results`: results.json, the CSV files, summary.md, the plot)."""

from __future__ import annotations

import csv
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional, Sequence

from avalanche_color import write_atomically
from avalanche_color.benchmarks.registry import BenchmarkSpec
from avalanche_color.runner.config import RunConfig

Run = dict[str, Any]


def weighted_mean(values: Sequence[float], weights: Sequence[int]) -> float:
    """Accuracy over all samples from per-experience accuracies (Avalanche's stream accuracy)."""
    return sum(v * w for v, w in zip(values, weights)) / sum(weights)


def forgetting(matrix: Sequence[Sequence[Optional[float]]]) -> float:
    """Avalanche's ``StreamForgetting`` after the last training experience, from the accuracy matrix.

    ``matrix[i][j]``: accuracy on test experience j after training experience i. Avalanche pairs
    test experience j with training experience j: its accuracy just after that training is its
    initial value, and its forgetting is the drop from there to the end; the stream's is the
    mean over the test experiences that have a training experience before the last (0.0 when
    none has). With a test experience per training experience this is the usual mean drop over
    all but the last experience; with CORe50's one test set of held-out sessions it is that
    set's accuracy after the first session minus its accuracy at the end. Computed here because
    with task labels Avalanche splits its stream metrics per task.
    """
    last = len(matrix) - 1
    paired = range(min(last, len(matrix[-1])))
    if not paired:
        return 0.0
    drops = []
    for j in paired:
        initial, final = matrix[j][j], matrix[last][j]
        if initial is None or final is None:
            raise ValueError(f"the accuracy matrix has no accuracy for test experience {j} after training "
                             f"experience {j} or after the last one; got {matrix!r}")
        drops.append(initial - final)
    return statistics.fmean(drops)


def by_label(runs: Sequence[Run]) -> dict[str, list[Run]]:
    groups: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        groups[run["label"]].append(run)
    return dict(groups)


def mean_and_spread(values: Sequence[float]) -> str:
    """``mean ± std`` in percent over seeds (just the value for one seed)."""
    mean = 100 * statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.1f}"
    return f"{mean:.1f} ± {100 * statistics.stdev(values):.1f}"


def summary_rows(runs: Sequence[Run]) -> list[dict[str, Any]]:
    rows = []
    for label, group in by_label(runs).items():
        routed = [r["routing_accuracy"] for r in group if r.get("routing_accuracy") is not None]
        rows.append({
            "method": label,
            "seeds": len(group),
            "average accuracy": mean_and_spread([r["average_accuracy"] for r in group]),
            "forgetting": mean_and_spread([r["forgetting"] for r in group]),
            "routing accuracy": mean_and_spread(routed) if routed else "-",
            "trainable params / exp": f"{group[0]['trainable_parameters_per_experience']:,}",
            "minutes / run": f"{statistics.fmean(r['wall_seconds'] for r in group) / 60:.1f}",
        })
    return rows


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(row[c]) for c in header) + " |" for row in rows]
    return "\n".join(lines)


GRID_ENDS = {-1: "the grid's lowest", 1: "the grid's highest"}


def grid_end(lr: float, grid: Sequence[float]) -> Optional[int]:
    """-1 where ``lr`` is the grid's lowest value, +1 its highest, None inside it (or in a grid of one value,
    which has no end a better lr could lie beyond)."""
    if len(grid) < 2:
        return None
    return -1 if lr == min(grid) else 1 if lr == max(grid) else None


def percent(accuracy: Optional[float]) -> str:
    """A trial's accuracy in %, or "diverged" where its training did."""
    return "diverged" if accuracy is None else f"{100 * accuracy:.1f}"


def tuning_table(tuning: dict[str, Any]) -> str:
    """What ``--tune`` chose (results.json's ``tuning``): each method's lr, its validation accuracy and
    every trial's, in %. A choice at either end of the grid is marked: the method's best may lie beyond it."""
    grid = tuning.get("grid") or []
    ends = {method: grid_end(choice["lr"], grid) for method, choice in tuning["choices"].items()}
    rows = [{"method": method,
             "lr chosen": f"{choice['lr']:g}" + (f" ({GRID_ENDS[ends[method]]})" if ends[method] else ""),
             "validation accuracy": percent(choice["validation_accuracy"]),
             "trials (lr: validation accuracy)": ", ".join(f"{lr}: {percent(accuracy)}"
                                                           for lr, accuracy in choice["trials"].items())}
            for method, choice in tuning["choices"].items()]
    split = f"{tuning['held_out']:g} of each class held out, seed {tuning['seed']}"
    at_an_end = [method for method, end in ends.items() if end]
    beyond = (f"\n\n{', '.join(at_an_end)}: chosen at an end of the grid, so the best lr may lie beyond it "
              f"(`--lr-grid` tries others)." if at_an_end else "")
    return f"Learning rates chosen by `--tune {tuning['tuned']}` ({split}):\n\n{markdown_table(rows)}{beyond}"


def learned_nothing_note(runs: Sequence[Run]) -> str:
    """One line naming the runs with an experience that learned nothing (each record's ``learned_nothing``: its
    training accuracy no better than chance, or its loss did not fall), with their experiences and learning rate;
    empty when there are none."""
    found = []
    for run in runs:
        findings = run.get("learned_nothing") or []
        if findings:
            experiences = ", ".join(str(finding["experience"]) for finding in findings)
            lrs = sorted({finding["lr"] for finding in findings if finding.get("lr") is not None})
            lr = f", lr {', '.join(f'{value:g}' for value in lrs)}" if lrs else ""
            found.append(f"{run['label']} seed {run['seed']} (experience{'s' if len(findings) > 1 else ''} "
                         f"{experiences}{lr})")
    if not found:
        return ""
    return (f"Learned nothing (training accuracy no better than chance, or the loss did not fall; see each run's "
            f"`learned_nothing` in results.json): {'; '.join(found)}.")


def write_csv(runs: Sequence[Run], folder: Path) -> None:
    """``runs.csv``: one row per (method, seed); ``accuracy_matrices.csv``: one row per matrix entry."""
    fields = ["label", "method", "seed", "rank", "k", "average_accuracy", "forgetting", "routing_accuracy",
              "trainable_parameters_per_experience", "wall_seconds", "cpu_seconds"]
    with open(folder / "runs.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(runs)
    with open(folder / "accuracy_matrices.csv", "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["label", "seed", "after_experience", "experience", "accuracy"])
        for run in runs:
            for trained, row in enumerate(run["accuracy_matrix"]):
                writer.writerows([run["label"], run["seed"], trained, tested, accuracy]
                                 for tested, accuracy in enumerate(row) if accuracy is not None)


def seen_accuracy_curve(matrix: Sequence[Sequence[Optional[float]]]) -> list[float]:
    """Mean of the per-experience accuracies over the experiences seen so far, after each experience.

    Unweighted, so every experience counts the same; the table's average accuracy is over test
    samples (Avalanche's stream accuracy) and differs when experiences differ in size. A row
    holds the experiences evaluated (those seen so far; all of them in a joint run's one row).
    """
    return [statistics.fmean(a for a in row if a is not None) for row in matrix]


def plot_accuracy(runs: Sequence[Run], path: Path | None = None, title: str = ""):
    """Accuracy on the experiences seen so far, after each experience, per method (mean and spread).

    Returns the matplotlib Figure (a notebook shows it) and saves it to ``path`` if given. It is
    built without pyplot, so it neither needs a display nor changes a notebook's backend.
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(6.4, 4.2))
    axes = figure.add_subplot()
    for label, group in by_label(runs).items():
        curves = [seen_accuracy_curve(r["accuracy_matrix"]) for r in group]
        experiences = len(group[0]["accuracy_matrix"][0])
        if len(curves[0]) == 1 and experiences > 1:
            # A joint run (one training on all experiences, so one row): a dashed level, the upper bound.
            level = 100 * statistics.fmean(c[0] for c in curves)
            axes.plot([1, experiences], [level, level], linestyle="--", label=label)
            continue
        steps = range(1, len(curves[0]) + 1)
        mean = [100 * statistics.fmean(c[i] for c in curves) for i in range(len(curves[0]))]
        axes.plot(steps, mean, marker="o", label=label)
        if len(curves) > 1:
            spread = [100 * statistics.stdev(c[i] for c in curves) for i in range(len(curves[0]))]
            axes.fill_between(steps, [m - s for m, s in zip(mean, spread)], [m + s for m, s in zip(mean, spread)],
                              alpha=0.2)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("experiences trained")
    axes.set_ylabel("mean accuracy over experiences seen (%)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    if path is not None:
        figure.savefig(path, dpi=120)
    return figure


def write_results(result: dict[str, Any], config: RunConfig, spec: BenchmarkSpec, out: Path) -> str:
    """Write every output file of a finished comparison; returns its summary table."""
    runs = result["runs"]
    write_atomically(out / "results.json", (json.dumps(result, indent=2) + "\n").encode())
    write_csv(runs, out)
    table = markdown_table(summary_rows(runs))
    note = learned_nothing_note(runs)
    if note:
        table += f"\n\n{note}"
    if "tuning" in result:
        table += f"\n\n{tuning_table(result['tuning'])}"
    command = f"`{config.command}`\n\n" if config.command else ""
    write_atomically(out / "summary.md", (
        f"{command}{config.benchmark} ({spec.scenario}), backbone {config.backbone or spec.backbone}, "
        f"{config.epochs} epochs per experience, batch {config.batch_size}, device {result['device']}; "
        f"accuracy and forgetting in % after the last experience (mean ± std over seeds)\n\n{table}\n").encode())
    plot_accuracy(runs, out / "accuracy.png", title=f"{config.benchmark} ({spec.scenario})")
    return table
