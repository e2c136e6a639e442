"""What each method learns and what it keeps: one table from one or more comparisons on the same benchmark.

    python -m benchmarks.reporting.diagonals benchmarks/results/pacs_vit_ti benchmarks/results/pacs_vit_ti_peers

For every method (mean ± std over its seeds, in %):

* **final**: the average accuracy after the last experience (the tables' headline number);
* **diagonal**: each test experience's accuracy right after its own training experience, averaged with
  the same weights (test sizes): what the method learns of each experience while it is new;
* **kept**: final minus diagonal, what the later experiences cost (negative: lost; positive: an earlier
  experience gained from later training, as a shared model may);
* **routing**: for the routed-expert methods, the share of test samples sent to the expert trained on
  their experience.

A method routed perfectly with experts that never change keeps its diagonal; so the gap between
CoLoR's diagonal and its final accuracy is what its routing costs, and the diagonal against a peer's
says whose experts learn more. Only runs whose test stream is paired with the training stream (one
test experience per training experience) have a diagonal; a joint run (one row) has none.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Optional, Sequence

from avalanche_color.runner.report import by_label, markdown_table, mean_and_spread, weighted_mean


def diagonal(run: dict[str, Any], weights: Sequence[float]) -> Optional[float]:
    """The weighted mean of the accuracy matrix's diagonal; None for a run with one row (joint training)."""
    matrix = run["accuracy_matrix"]
    if len(matrix) != len(matrix[-1]) or len(matrix) == 1:
        return None
    return weighted_mean([matrix[i][i] for i in range(len(matrix))], weights)


def experience_sizes(runs: Sequence[dict[str, Any]], largest: int = 100_000) -> list[int]:
    """Each test experience's size, which weights ``average_accuracy`` and which results.json does not store:
    for each column of the accuracy matrices, the smallest count of samples that makes every accuracy in it
    (every run, every row) a whole number of right answers. Many different accuracies leave one count; the
    streams' test sizes do not change with the seed (a seeded split of each class's fixed share)."""
    columns = len(runs[0]["accuracy_matrix"][-1])
    sizes = []
    for column in range(columns):
        values = {row[column] for run in runs for row in run["accuracy_matrix"] if row[column] is not None}
        size = next((n for n in range(1, largest + 1)
                     if all(abs(value * n - round(value * n)) < 1e-6 for value in values)), None)
        if size is None:
            raise ValueError(f"no test size up to {largest} gives test experience {column}'s accuracies")
        sizes.append(size)
    return sizes


def spread(values: Sequence[Optional[float]]) -> str:
    """The summary tables' ``mean ± std`` in percent of the values present; "-" where none is."""
    present = [value for value in values if value is not None]
    return mean_and_spread(present) if present else "-"


def rows(folders: Sequence[Path]) -> list[list[str]]:
    """One row per method of ``folders``' results.json (or their attempt's finished runs), in order."""
    every_run = {folder: finished_runs(folder) for folder in folders}
    sizes = experience_sizes([run for runs in every_run.values() for run in runs])
    for run in (run for runs in every_run.values() for run in runs):  # the sizes give the runner's own averages
        if len(run["accuracy_matrix"][-1]) == len(sizes) and \
                abs(weighted_mean(run["accuracy_matrix"][-1], sizes) - run["average_accuracy"]) > 1e-9:
            raise ValueError(f"the test sizes {sizes} do not give {run['label']} seed {run['seed']}'s average "
                             f"accuracy: were these comparisons run on one benchmark with one split?")
    table = []
    for folder, runs_of_folder in every_run.items():
        for label, runs in by_label(runs_of_folder).items():
            finals = [run["average_accuracy"] for run in runs]
            diagonals = [diagonal(run, sizes) for run in runs]
            kept = [None if d is None else f - d for f, d in zip(finals, diagonals)]
            routing = [run.get("routing_accuracy") for run in runs]
            table.append([label, str(len(runs)), spread(finals), spread(diagonals), spread(kept), spread(routing)])
    return table


def finished_runs(folder: Path) -> list[dict[str, Any]]:
    """The runs of a finished comparison (results.json), else those an unfinished one has written so far."""
    results = folder / "results.json"
    if results.is_file():
        return json.loads(results.read_text())["runs"]
    return [json.loads(path.read_text()) for path in sorted((folder / "attempt" / "runs").glob("*.json"))
            if path.name != "provenance.json"]


def markdown(table: list[list[str]]) -> str:
    header = ["method", "seeds", "final", "diagonal", "kept", "routing"]
    return markdown_table([dict(zip(header, row)) for row in table])


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="comparison folders on one benchmark")
    print(markdown(rows(parser.parse_args(argv).folders)))


if __name__ == "__main__":
    main()
