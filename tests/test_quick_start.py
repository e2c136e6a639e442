"""The README's quick start runs exactly as printed, offline, and learns."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

import pytest

from code_blocks import REPOSITORY, runnable

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


def test_the_quick_start_is_short_fits_the_page_and_uses_a_shipped_backbone():
    code = quick_start()
    lines = code.strip().splitlines()
    assert len(lines) <= 25 and max(len(line) for line in lines) <= 90  # no sideways scrolling on the site
    assert 'offline_backbone("digits")' in code and "backbone_transform(vit)" in code
    assert "create_model" not in code  # no pretraining of its own: that is the guide's longer example


# qpsolvers as it is where no QP solver imports: Avalanche imports it (for GEM) with avalanche.benchmarks, and it
# warns then, from qpsolvers.solvers, with this message (qpsolvers 4.x).
NO_QP_SOLVER = {
    "qpsolvers/__init__.py": "from .solvers import available_solvers\n",
    "qpsolvers/solvers/__init__.py": (
        "import warnings\navailable_solvers = []\nwarnings.warn('no QP solver found on your system, you can "
        "install solvers from PyPI by ``pip install qpsolvers[open_source_solvers]``')\n"),
}


def test_the_stand_in_for_qpsolvers_warns_as_it_does_without_a_solver(tmp_path):
    for name, text in NO_QP_SOLVER.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    run = subprocess.run([sys.executable, "-c", "import qpsolvers"], env={**os.environ, "PYTHONPATH": str(tmp_path)},
                         capture_output=True, text=True, timeout=60)
    assert "qpsolvers/solvers/__init__.py:3: UserWarning: no QP solver found" in run.stderr


@pytest.mark.slow
def test_quick_start_runs_as_printed_offline_learns_and_warns_of_nothing_even_without_a_qp_solver(tmp_path):
    """The quick start as printed, offline (HF_HUB_OFFLINE=1), learns well above chance and prints no warning, even
    where no QP solver imports: it imports avalanche_color before Avalanche, so the package's narrow filter (this
    message, from qpsolvers) is in place when Avalanche imports qpsolvers; any other warning would still show."""
    for name, text in NO_QP_SOLVER.items():
        (tmp_path / "path" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "path" / name).write_text(text)
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                   "PYTHONPATH": os.pathsep.join([str(tmp_path / "path"), str(REPOSITORY)])}
    run = subprocess.run([sys.executable, "-c", quick_start()], cwd=tmp_path, env=environment, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    assert float(run.stdout.strip().splitlines()[-1]) > 0.7
    assert not re.search(r"warn", run.stderr, flags=re.IGNORECASE), run.stderr


def test_the_longer_example_is_on_the_guide_page_and_runs_there():
    from code_blocks import REPOSITORY as root

    guide = root / "docs" / "guide" / "index.md"
    assert any("pretrained = {k: v.clone()" in block.code and "save" in block.code.lower()
               for block in runnable(guide))
