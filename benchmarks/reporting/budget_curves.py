"""CoLoR and its rivals as the training budget grows: tables and one plot from a folder of comparisons.

    python -m benchmarks.reporting.budget_curves benchmarks/results/pacs_budget

Every comparison under the folder is a set of budget points: ``<folder>/<name>/results.json``, or, for one
still running, the runs its attempt has finished so far (marked in the tables). A point is a method at one
number of epochs per experience, on the training images its comparison kept (``--train-per-class``), at its
rank: ``CoLoR r=64`` and ``CoLoR r=8`` are two lines. For each point, over its seeds (in %):

* **final**: the average accuracy after the last experience;
* **diagonal**: each test experience's accuracy right after its own training experience (what was learned
  while it was new; :mod:`benchmarks.reporting.diagonals`);
* **routing**: for the routed-expert methods, the share of test samples sent to their experience's expert.

The training-free methods (NCM, RanPAC: no learning rate) do not depend on the epochs; they are one
value, drawn as a level. Writes ``budget.md`` (the tables, each point's lr, how it was chosen and its CPU
time) and ``budget.png`` (final, diagonal and routing against epochs, log scale) into the folder.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from avalanche_color.runner.methods import METHODS
from avalanche_color.runner.report import mean_and_spread
from benchmarks.reporting.diagonals import diagonal, experience_sizes, finished_runs

METRICS = ("final", "diagonal", "routing")


@dataclass(frozen=True)
class Point:
    """One method at one budget: its runs' metrics (one value per seed, fractions) and where they come from."""

    line: str  # the method and, where it takes one, its rank: "CoLoR r=64"
    epochs: Optional[int]  # None: a training-free method, the same at every budget
    images: Optional[int]  # training images kept per class (per class and domain on PACS); None: all
    seeds: tuple[int, ...]
    final: tuple[float, ...]
    diagonal: tuple[Optional[float], ...]
    routing: tuple[Optional[float], ...]
    lrs: tuple[Optional[float], ...]
    lr_chosen_by: Optional[str]
    cpu_seconds: float
    trained_by: Optional[str]  # evaluated on that line's experts, not trained (a CoLoR variant beside CoLoR)
    comparison: str  # the folder's name under the budget folder
    finished: bool  # False: the comparison is still running, these are its runs so far


def comparison_runs(folder: Path) -> tuple[dict[str, Any], list[dict[str, Any]], bool]:
    """A comparison's settings, its runs (:func:`~benchmarks.reporting.diagonals.finished_runs`: its attempt's so
    far, where it is still running) and whether it has finished."""
    finished = (folder / "results.json").is_file()
    settings = (json.loads((folder / "results.json").read_text())["config"] if finished else
                json.loads((folder / "attempt" / "runs" / "provenance.json").read_text())["settings"])
    return settings, finished_runs(folder), finished


def points(folder: Path) -> list[Point]:
    """Every budget point under ``folder``, in the order of its comparisons' names and their runs."""
    comparisons = sorted(path.parent for path in folder.glob("*/results.json"))
    comparisons += sorted(path.parent.parent.parent for path in folder.glob("*/attempt/runs/provenance.json")
                          if path.parent.parent.parent not in comparisons)
    if not comparisons:
        raise FileNotFoundError(f"no comparison under {str(folder)!r}: expected <name>/results.json (or a running "
                                "comparison's <name>/attempt/runs/)")
    found = {path: comparison_runs(path) for path in comparisons}
    sizes = experience_sizes([run for _, runs, _ in found.values() for run in runs])
    result = []
    for path, (config, runs, finished) in found.items():
        groups: dict[str, list[dict[str, Any]]] = {}
        for run in runs:
            groups.setdefault(line_of(run), []).append(run)
        for line, group in groups.items():
            trains = any(run.get("lr") is not None for run in group)
            result.append(Point(
                line=line, epochs=config["epochs"] if trains else None, images=config.get("train_per_class"),
                seeds=tuple(run["seed"] for run in group), final=tuple(run["average_accuracy"] for run in group),
                diagonal=tuple(diagonal(run, sizes) for run in group),
                routing=tuple(run.get("routing_accuracy") for run in group),
                lrs=tuple(run.get("lr") for run in group), lr_chosen_by=group[0].get("lr_chosen_by"),
                cpu_seconds=sum(run["cpu_seconds"] for run in group), trained_by=group[0].get("trained_by"),
                comparison=path.name, finished=finished))
    return result


def first_measured(found: Sequence[Point]) -> list[Point]:
    """The points the tables and plot show: each line's first at each budget and training-image count (in the order
    of the comparisons' names); a later one is a repeat (:func:`repeats`)."""
    seen: set[tuple[str, Optional[int], Optional[int]]] = set()
    first = []
    for point in found:
        key = (point.line, point.epochs, point.images)
        if key not in seen:
            seen.add(key)
            first.append(point)
    return first


def repeats(found: Sequence[Point]) -> list[tuple[Point, Point]]:
    """Each point measured again in a later comparison (e.g. CoLoR beside the variants it trains for), with the
    first: a check that the same settings give the same result."""
    first = {(point.line, point.epochs, point.images): point for point in reversed(first_measured(found))}
    shown = set(map(id, first.values()))
    return [(first[(point.line, point.epochs, point.images)], point) for point in found if id(point) not in shown]


def line_of(run: dict[str, Any]) -> str:
    """The line a run belongs to: its method, and its rank where it has one."""
    return run["method"] + (f" r={run['rank']}" if run.get("rank") else "")


def in_order(found: Sequence[Point]) -> list[str]:
    """The lines in the runner's order of methods, the larger rank first."""
    order = list(METHODS)

    def key(line: str) -> tuple[int, int]:
        method, _, rank = line.partition(" r=")
        return (order.index(method) if method in order else len(order), -int(rank or 0))

    return sorted(dict.fromkeys(point.line for point in found), key=key)


def budgets(found: Sequence[Point]) -> list[int]:
    return sorted({point.epochs for point in found if point.epochs is not None})


def cell(values: Sequence[Optional[float]], finished: bool = True) -> str:
    present = [value for value in values if value is not None]
    if not present:
        return "-"
    return mean_and_spread(present) + ("" if finished else "*")


def metric_table(found: Sequence[Point], metric: str) -> str:
    """One row per line, one column per budget in epochs (a training-free line: one value, in every column)."""
    columns = budgets(found)
    lines = in_order(found)
    rows = ["| method | " + " | ".join(f"{epochs} epochs" for epochs in columns) + " |",
            "|---|" + "---|" * len(columns)]
    for line in lines:
        at = {point.epochs: point for point in found if point.line == line}
        if metric == "routing" and all(cell(point.routing) == "-" for point in at.values()):
            continue
        cells = []
        for epochs in columns:
            point = at.get(epochs, at.get(None))
            cells.append("" if point is None else cell(getattr(point, metric), point.finished))
        rows.append(f"| {line} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def points_table(found: Sequence[Point]) -> str:
    """Every point's provenance: its comparison, training images, seeds, lr and its choice, CPU hours."""
    rows = ["| method | epochs | training images per class | seeds | lr | lr chosen by | CPU h | comparison |",
            "|---|---|---|---|---|---|---|---|"]
    lines = in_order(found)
    for point in sorted(found, key=lambda p: (lines.index(p.line), p.epochs or 0)):
        lrs = sorted({f"{lr:g}" for lr in point.lrs if lr is not None}) or ["-"]
        chosen = (point.lr_chosen_by or "-").split(":")[0]
        rows.append(f"| {point.line} | {point.epochs or 'any'} | {point.images or 'all'} | "
                    f"{' '.join(map(str, point.seeds))} | {', '.join(lrs)} | {chosen} | "
                    f"{point.cpu_seconds / 3600:.2f}{on_experts(point)} | {point.comparison}{'' if point.finished else ' (running)'} |")
    return "\n".join(rows)


def on_experts(point: Point) -> str:
    """Where a point evaluated another run's experts: whose (its CPU time is the evaluation's alone)."""
    return f" (evaluated on {point.trained_by}'s experts)" if point.trained_by else ""


def markdown(found: Sequence[Point], title: str) -> str:
    running = any(not point.finished for point in found)
    parts = [f"# {title}", "",
             "Made by `python -m benchmarks.reporting.budget_curves` from the comparisons in this folder; "
             "mean ± std over seeds where there are several, in %."
             + (" `*`: a comparison still running (its runs so far)." if running else ""), ""]
    shown = first_measured(found)
    for metric, about in (("final", "Average accuracy after the last experience"),
                          ("diagonal", "Diagonal: each experience's accuracy right after its own training"),
                          ("routing", "Routing accuracy: test samples sent to their experience's expert")):
        parts += [f"## {about}", "", metric_table(shown, metric), ""]
    total = sum(point.cpu_seconds for point in found) / 3600
    parts += ["## The points", "", points_table(found), "", f"CPU time of every run above: {total:.1f} h.", ""]
    again = repeats(found)
    if again:
        parts += ["## Points measured again", "", "The tables show the first; a later comparison's run of the same "
                  "method, budget and training images is a check of it (`trained_by` aside, the same settings).", "",
                  "| method | epochs | first | average accuracy | again in | average accuracy | difference |",
                  "|---|---|---|---|---|---|---|"]
        for first, repeat in again:
            difference = statistics.fmean(repeat.final) - statistics.fmean(first.final)
            parts.append(f"| {first.line} | {first.epochs or 'any'} | {first.comparison} | {cell(first.final)} | "
                         f"{repeat.comparison} | {cell(repeat.final)} | "
                         f"{'none' if difference == 0 else f'{100 * difference:+.2f}'} |")
        parts.append("")
    return "\n".join(parts)


def plot(found: Sequence[Point], path: Optional[Path] = None, title: str = ""):
    """Final, diagonal and routing accuracy against epochs per experience (log scale): one line per method,
    a marker at each measured point, the training-free methods as dashed levels. Returns the Figure."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, NullFormatter, ScalarFormatter

    found = first_measured(found)
    columns = budgets(found)
    figure = Figure(figsize=(16, 5.2), layout="constrained")
    # One percentage scale for the three panels, so that a flat routing line reads as flat, not zoomed into noise.
    axes = figure.subplots(1, 3, sharey=True)
    lines = in_order(found)
    colours = {line: f"C{index % 10}" for index, line in enumerate(lines)}
    styles = {line: ("-", "o") if index < 10 else ("--", "s") for index, line in enumerate(lines)}
    for axis, metric, label in zip(axes, METRICS, ("average accuracy (%)", "diagonal (%)",
                                                   "routing accuracy (%)")):
        for line in lines:
            at = sorted((point for point in found if point.line == line), key=lambda p: p.epochs or 0)
            values = [(point.epochs, statistics.fmean(v for v in getattr(point, metric) if v is not None))
                      for point in at if any(v is not None for v in getattr(point, metric))]
            if not values:
                continue
            if values[0][0] is None:  # training-free: one level across the budgets
                axis.hlines(100 * values[0][1], columns[0] if columns else 1, columns[-1] if columns else 2,
                            colors=colours[line], linestyles=":", label=line)
                continue
            style, marker = styles[line]
            axis.plot([epochs for epochs, _ in values], [100 * value for _, value in values], style,
                      marker=marker, color=colours[line], label=line)
        axis.set_xscale("log")
        axis.xaxis.set_major_locator(FixedLocator(columns or [1]))
        axis.xaxis.set_major_formatter(ScalarFormatter())
        axis.xaxis.set_minor_formatter(NullFormatter())
        axis.set_xlabel("epochs per experience")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="best")
    if title:
        figure.suptitle(title)
    if path is not None:
        figure.savefig(path, dpi=110)
    return figure


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a folder of comparisons at several budgets, e.g. "
                                                  "benchmarks/results/pacs_budget")
    parser.add_argument("--title", default=None, help="the page's and plot's title (default: from the folder)")
    args = parser.parse_args(argv)
    found = points(args.folder)
    title = args.title or f"{args.folder.name.replace('_budget', '')}: accuracy against the training budget"
    (args.folder / "budget.md").write_text(markdown(found, title))
    plot(found, args.folder / "budget.png", title)
    print(metric_table(first_measured(found), "final"))
    print(f"\nwritten to {args.folder / 'budget.md'} and {args.folder / 'budget.png'}")


if __name__ == "__main__":
    main()
