"""Importing the package prints nothing, even where Avalanche's dependencies would warn on import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).parents[1]


def test_import_prints_no_warning_even_without_a_qp_solver(tmp_path):
    # qpsolvers (imported by Avalanche for GEM) warns like this when it finds no QP solver.
    (tmp_path / "qpsolvers.py").write_text(
        "import warnings\nwarnings.warn('no QP solver found on your system, you can install solvers', UserWarning)\n")
    run = subprocess.run([sys.executable, "-c", "import avalanche_color"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, env={"PYTHONPATH": f"{tmp_path}:{REPOSITORY}", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    assert run.stderr == "" and run.stdout == ""
    unfiltered = subprocess.run([sys.executable, "-c", "import qpsolvers"], cwd=tmp_path, capture_output=True,
                                text=True, timeout=60, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert "no QP solver found" in unfiltered.stderr  # the stand-in does warn
