"""Does a fresh comparison agree with the committed one? Row by row, within the spread over seeds.

    python -m benchmarks.reporting.reproduce digits_class digits_domain

compares ``runs/<name>/results.json`` (a fresh run, e.g. from ``make main``) with
``benchmarks/results/<name>/results.json`` (the committed one the README shows). Another
machine gives other numbers for every single seed (float sums differ between CPU kinds, and
a few changed sums move a short training run by several points), so digits are not expected
to match; the means over seeds are. A row agrees when its two means differ by at most
``TOLERANCE`` times the larger of the two standard deviations over seeds. Exit status 1 if a
row disagrees or is missing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from avalanche_color.runner.report import by_label
from benchmarks import REPOSITORY

RESULTS = REPOSITORY / "benchmarks" / "results"  # the committed results (make main-publish writes them)
SCRATCH = REPOSITORY / "runs"  # a fresh run's (make main writes them)

TOLERANCE = 2.0  # standard deviations
METRICS = ("average_accuracy", "forgetting")


def compare_rows(fresh: Sequence[dict[str, Any]], committed: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (method, metric) of the committed runs: both means and spreads, and the verdict."""
    fresh_groups = by_label(fresh)
    rows = []
    for label, group in by_label(committed).items():
        for metric in METRICS:
            expected = [100 * run[metric] for run in group]
            found = [100 * run[metric] for run in fresh_groups.get(label, [])]
            rows.append({"method": label, "metric": metric.replace("_", " "), **verdict(found, expected)})
    return rows


def verdict(found: Sequence[float], expected: Sequence[float]) -> dict[str, Any]:
    """Means, spreads and whether ``found`` agrees with ``expected`` within ``TOLERANCE`` spreads."""
    if not found:
        return {"fresh": "-", "committed": summary(expected), "agrees": False, "why": "no fresh run"}
    spread = max(spread_of(found) or 0.0, spread_of(expected) or 0.0)
    difference = statistics.fmean(found) - statistics.fmean(expected)
    if spread == 0.0:
        return {"fresh": summary(found), "committed": summary(expected), "agrees": abs(difference) < 0.05,
                "why": "one seed each: no spread to judge by, so only an equal result agrees"}
    agrees = abs(difference) <= TOLERANCE * spread
    return {"fresh": summary(found), "committed": summary(expected), "agrees": agrees,
            "why": f"difference {difference:+.1f} = {difference / spread:+.1f} x the larger spread"}


def spread_of(values: Sequence[float]) -> Optional[float]:
    return statistics.stdev(values) if len(values) > 1 else None


def summary(values: Sequence[float]) -> str:
    spread = spread_of(values)
    mean = statistics.fmean(values)
    return f"{mean:.1f}" if spread is None else f"{mean:.1f} ± {spread:.1f} ({len(values)} seeds)"


def runs_of(folder: Path) -> list[dict[str, Any]]:
    path = folder / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"no results in {str(path)!r}: run the comparison first (e.g. make main)")
    return json.loads(path.read_text())["runs"]


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="+", help="comparison folders, e.g. digits_class digits_domain")
    parser.add_argument("--fresh", type=Path, default=SCRATCH, help="where the fresh runs are (default: runs/)")
    parser.add_argument("--committed", type=Path, default=RESULTS, help="default: benchmarks/results/")
    args = parser.parse_args(argv)
    failed = 0
    for name in args.names:
        try:
            rows = compare_rows(runs_of(args.fresh / name), runs_of(args.committed / name))
        except FileNotFoundError as error:
            parser.error(str(error))
        print(f"\n{name}: fresh ({args.fresh / name}) against committed ({args.committed / name})")
        for row in rows:
            mark = "agrees" if row["agrees"] else "DIFFERS"
            print(f"  {row['method']:<16} {row['metric']:<17} fresh {row['fresh']:<22} committed "
                  f"{row['committed']:<22} {mark}: {row['why']}")
        failed += sum(not row["agrees"] for row in rows)
    print(f"\n{'every row agrees' if not failed else f'{failed} row(s) differ'} "
          f"(a row agrees when its means differ by at most {TOLERANCE:g} x the larger spread over seeds)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
