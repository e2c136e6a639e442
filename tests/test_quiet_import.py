"""Importing the package is quick and quiet: nothing heavy until a name is used, no warning printed."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import avalanche_color

REPOSITORY = Path(__file__).parents[1]
PACKAGE = REPOSITORY / "avalanche_color"
# Imported only where used: each takes a noticeable share of a second to import.
HEAVY_OPTIONAL = ("wandb", "matplotlib", "sklearn", "scipy", "pandas")


def _python(code: str, cwd: Path, pythonpath: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=180,
                          env={"PYTHONPATH": pythonpath, "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})


def test_import_loads_none_of_torch_timm_avalanche_wandb_or_matplotlib(tmp_path):
    code = ("import sys, json, avalanche_color, avalanche_color.config\n"
            "print(json.dumps(sorted(m for m in ('torch', 'timm', 'avalanche', *%r) if m in sys.modules)))"
            % (HEAVY_OPTIONAL,))
    run = _python(code, tmp_path, str(REPOSITORY))
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == []


def test_every_public_name_loads_on_first_use_without_scikit_learn(tmp_path):
    """The whole API, as ``from avalanche_color import *`` gives it; k-means loads scikit-learn when it runs."""
    code = ("import sys, json\nfrom avalanche_color import *\nimport avalanche_color\n"
            "print(json.dumps({'sklearn': 'sklearn' in sys.modules, "
            "'resolved': sorted(n for n in avalanche_color.__all__ if n in vars(avalanche_color))}))")
    run = _python(code, tmp_path, str(REPOSITORY))
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result == {"sklearn": False, "resolved": sorted(avalanche_color.__all__)}


def test_the_lazy_names_are_the_ones_type_checkers_see():
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    [checking] = [node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"]
    seen = {alias.name: node.module for node in checking.body if isinstance(node, ast.ImportFrom)
            for alias in node.names}
    assert seen == avalanche_color._EXPORTS
    # The lazy names and the one function written in __init__ itself, over every model class.
    assert avalanche_color.__all__ == sorted([*avalanche_color._EXPORTS, "load_pretrained"])
    for name, module in sorted(avalanche_color._EXPORTS.items()):
        assert getattr(avalanche_color, name) is getattr(sys.modules[module], name)
    # dir() lists the public names, not the helpers __init__ imports for itself (Path, import_module, ...).
    assert dir(avalanche_color) == sorted([*avalanche_color.__all__, "__version__"])
    with pytest.raises(AttributeError, match="module 'avalanche_color' has no attribute 'Colour'"):
        avalanche_color.Colour  # noqa: B018


def test_no_module_of_the_package_imports_an_optional_heavy_library_at_import_time():
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:  # module level only; functions import when they run
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            problems += [f"{path.relative_to(REPOSITORY)}:{node.lineno} imports {name}" for name in names
                         if name.split(".")[0] in HEAVY_OPTIONAL]
    assert problems == []


@pytest.mark.parametrize("statement", ["from avalanche_color import *", "import avalanche_color.color.strategy"])
def test_import_prints_no_warning_even_without_a_qp_solver(tmp_path, statement):
    # qpsolvers (imported by Avalanche for GEM) warns like this when it finds no QP solver.
    (tmp_path / "qpsolvers.py").write_text(
        "import warnings\nwarnings.warn('no QP solver found on your system, you can install solvers', UserWarning)\n")
    run = _python(statement, tmp_path, f"{tmp_path}:{REPOSITORY}")
    assert run.returncode == 0, run.stderr
    assert run.stderr == "" and run.stdout == ""
    unfiltered = _python("import qpsolvers", tmp_path, str(tmp_path))
    assert "no QP solver found" in unfiltered.stderr  # the stand-in does warn
