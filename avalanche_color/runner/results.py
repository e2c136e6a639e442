"""Writing a comparison's results: results.json, the CSV files, summary.md and the plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from avalanche_color import write_atomically
from avalanche_color.benchmarks.registry import BenchmarkSpec
from avalanche_color.runner.config import RunConfig
from avalanche_color.runner.report import markdown_table, plot_accuracy, summary_rows, tuning_table, write_csv


def write_results(result: dict[str, Any], config: RunConfig, spec: BenchmarkSpec, out: Path) -> str:
    """Write every output file of a finished comparison; returns its summary table."""
    runs = result["runs"]
    write_atomically(out / "results.json", (json.dumps(result, indent=2) + "\n").encode())
    write_csv(runs, out)
    table = markdown_table(summary_rows(runs))
    if "tuning" in result:
        table += f"\n\n{tuning_table(result['tuning'])}"
    command = f"`{config.command}`\n\n" if config.command else ""
    write_atomically(out / "summary.md", (
        f"{command}{config.benchmark} ({spec.scenario}), backbone {config.backbone or spec.backbone}, "
        f"{config.epochs} epochs per experience, batch {config.batch_size}, device {result['device']}; "
        f"accuracy and forgetting in % after the last experience (mean ± std over seeds)\n\n{table}\n").encode())
    plot_accuracy(runs, out / "accuracy.png", title=f"{config.benchmark} ({spec.scenario})")
    return table
