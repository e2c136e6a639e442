"""Writing a comparison's results: results.json, the CSV files, summary.md and the plot."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from avalanche_color.utils.files import write_atomically
from benchmarks import REPOSITORY
from benchmarks.compare.config import ComparisonConfig
from benchmarks.reporting import markdown_table, plot_accuracy, summary_rows, write_csv
from benchmarks.streams.registry import BenchmarkSpec


def write_results(result: dict[str, Any], config: ComparisonConfig, spec: BenchmarkSpec, out: Path) -> str:
    """Write every output file of a finished comparison; returns its summary table."""
    runs = result["runs"]
    write_atomically(out / "results.json", (json.dumps(result, indent=2) + "\n").encode())
    write_csv(runs, out)
    table = markdown_table(summary_rows(runs))
    command = f"`{config.command}`\n\n" if config.command else ""
    write_atomically(out / "summary.md", (
        f"{command}{config.benchmark} ({spec.scenario}), backbone {config.backbone or spec.backbone}, "
        f"{config.epochs} epochs per experience, batch {config.batch_size}, device {result['device']}; "
        f"accuracy and forgetting in % after the last experience (mean ± std over seeds)\n\n{table}\n").encode())
    plot_accuracy(runs, out / "accuracy.png", title=f"{config.benchmark} ({spec.scenario})")
    return table


def config_record(config: ComparisonConfig) -> dict[str, Any]:
    """The config as JSON; paths inside the repository relative to it, so no machine's folders show."""
    return jsonable({name: repository_relative(value) if isinstance(value, Path) else value
                     for name, value in asdict(config).items()})


def repository_relative(path: Path) -> Path:
    try:
        return path.resolve().relative_to(REPOSITORY)
    except ValueError:
        return path


def slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9+=-]+", "_", label).strip("_")


def jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return str(value) if isinstance(value, Path) else value

