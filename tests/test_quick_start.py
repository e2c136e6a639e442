"""The README's quick start runs exactly as printed, offline, and learns."""

from __future__ import annotations

import ast
import re

import pytest

from code_blocks import REPOSITORY, run_page, runnable

README = REPOSITORY / "README.md"


def quick_start() -> str:
    section = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    [code] = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    return code


def test_quick_start_is_in_the_first_screen_of_the_readme():
    lines = README.read_text().splitlines()
    assert lines.index("## Quick start") < 15
    assert "import" in quick_start().splitlines()[0]


def test_the_quick_start_is_the_readmes_only_python_block():
    # So the README's run (tests/code_blocks.py, shared with test_docs.py) is the quick start's run.
    assert [block.code for block in runnable(README)] == [quick_start()]


@pytest.mark.slow
def test_quick_start_runs_as_printed_and_learns():
    run = run_page(README)  # offline, as promised (HF_HUB_OFFLINE=1), in an empty folder
    assert run.returncode == 0, run.stderr[-4000:]
    metrics_line, experts_line = run.stdout.strip().splitlines()[-2:]
    metrics = ast.literal_eval(metrics_line)
    assert metrics["Top1_Acc_Stream"] > 0.5 and metrics["RoutingAcc_Stream"] > 0.5  # chance: 0.1 and 0.2
    assert experts_line.startswith("experts:") and "predicted:" in experts_line
    assert "warn" not in run.stderr.lower(), run.stderr
    assert (run.folder / "log.txt").exists()
