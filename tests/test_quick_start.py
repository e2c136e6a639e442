"""The README's quick start runs exactly as printed, offline, and learns."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"


def quick_start() -> str:
    section = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    [code] = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    return code


def test_quick_start_is_in_the_first_screen_of_the_readme():
    lines = README.read_text().splitlines()
    assert lines.index("## Quick start") < 15
    assert "import" in quick_start().splitlines()[0]


@pytest.mark.slow
def test_quick_start_runs_as_printed_and_learns(tmp_path):
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}  # offline, as promised
    run = subprocess.run([sys.executable, "-c", quick_start()], cwd=tmp_path, env=environment,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    metrics_line, experts_line = run.stdout.strip().splitlines()[-2:]
    metrics = ast.literal_eval(metrics_line)
    assert metrics["Top1_Acc_Stream"] > 0.5 and metrics["RoutingAcc_Stream"] > 0.5  # chance: 0.1 and 0.2
    assert experts_line.startswith("experts:") and "predicted:" in experts_line
    assert "warn" not in run.stderr.lower(), run.stderr
    assert (tmp_path / "log.txt").exists()
