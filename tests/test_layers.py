"""The package's folders import one way: each only from the layers declared before it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import avalanche_color

PACKAGE = Path(avalanche_color.__file__).parent
# Lowest first. A folder (or top-level module) may import from its own folder and from
# earlier layers, never from its own layer's other folders or from a later one.
LAYERS: list[set[str]] = [
    {"version", "utils"},
    {"config", "backbones"},
    {"lora"},
    {"routing"},
    {"experts"},
    {"training"},
    {"color", "peers"},
    {"baselines"},  # RanPAC, NCM, Joint-LoRA (CoLoR's ExpertViT), FT-masked's plugin
    {"evaluation"},
    {"benchmarks"},  # the streams the runner runs on
    {"runner"},  # the comparison runner: uses the public API (below), never the layers' modules
]
# Modules of the package a layer may import besides its own folder and lower layers' folders:
# the runner, on top, uses what a user can (the top-level API, the backbones module, the value checks, and
# the option declarations a command line reads without torch: avalanche_color.config, e.g. its PRECISIONS,
# and CoLoR's, whose rank doc --rank shows), and the install check it runs before it imports torch.
PUBLIC_API_USERS = {"runner"}
PUBLIC_MODULES = {"avalanche_color", "avalanche_color.backbones", "avalanche_color.utils.checks",
                  "avalanche_color.config", "avalanche_color.color.config", "avalanche_color.utils.install_check"}
RANK = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``source``, in functions and
    ``TYPE_CHECKING`` blocks too; relative imports resolved against ``module``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            name = node.module or ""
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[:len(base) - (node.level - 1)]
                name = ".".join([*base, name] if name else base)
            found.append((node.lineno, name))
    return found


def upward_imports(source: str, module: str, is_package: bool = False) -> list[str]:
    """The imports of ``module`` (whose code is ``source``) that go against the layer order."""
    own = module.split(".")[1] if "." in module else None
    problems = []
    for line, imported in _imported_modules(source, module, is_package):
        parts = imported.split(".")
        if parts[0] != "avalanche_color" or own is None:
            continue  # another library, or the top-level API, which imports everything
        target = parts[1] if len(parts) > 1 else None
        if target == own:
            continue
        if own in PUBLIC_API_USERS:
            if imported not in PUBLIC_MODULES and target not in ("benchmarks",):
                problems.append(f"{module}:{line} imports {imported}, which is not public API")
            continue
        if target is None or RANK[target] >= RANK[own]:
            problems.append(f"{module}:{line} imports {imported}")
    return problems


def _package_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_folder_has_a_layer() -> None:
    parts = {path.relative_to(PACKAGE).parts[0].removesuffix(".py") for path in _package_files()}
    parts.discard("__init__")
    assert parts - set(RANK) == set(), "declare the new folder's place in LAYERS"


def test_every_import_goes_down() -> None:
    problems = []
    for path in _package_files():
        problems += upward_imports(path.read_text(), _module_name(path), path.name == "__init__.py")
    assert problems == []


@pytest.mark.parametrize("source", [
    "from avalanche_color.training.strategy import RoutedExpertsTemplate",  # experts -> training: up
    "import avalanche_color.experts.saved",  # routing -> experts: up
    "from avalanche_color import __version__",  # the top-level API imports everything
    "from ..training import resume",  # relative, still up
    "def late():\n    from avalanche_color.color.model import ExpertViT",  # inside a function
])
def test_the_check_sees_an_upward_import(source: str) -> None:
    # Checked as if it were in the routing folder, below experts, training and color.
    assert len(upward_imports(source, "avalanche_color.routing.routers")) == 1


def test_the_check_allows_own_folder_and_lower_layers() -> None:
    source = ("from avalanche_color.routing.classifiers import RandomFeatureRidge\n"
              "from avalanche_color.lora import Segments\nfrom avalanche_color.config import LoRAOptions\n"
              "from .classifiers import GaussianClassifier\nimport torch")
    assert upward_imports(source, "avalanche_color.routing.routers") == []
    # A layer that is one module (lora.py) is its own folder.
    assert upward_imports("import torch\nfrom avalanche_color.config import LoRAOptions", "avalanche_color.lora") == []
    assert upward_imports("import avalanche_color.routing.routers", "avalanche_color.lora") == [
        "avalanche_color.lora:1 imports avalanche_color.routing.routers"]
    assert upward_imports("from avalanche_color.peers.prompts import new_prompts",
                          "avalanche_color.color.model") == ["avalanche_color.color.model:1 imports "
                                                             "avalanche_color.peers.prompts"]


def test_the_runner_uses_the_public_api_and_its_streams_only():
    assert upward_imports("from avalanche_color import CoLoR\nfrom avalanche_color.benchmarks import BENCHMARKS",
                          "avalanche_color.runner.run") == []
    assert upward_imports("from avalanche_color.training.resume import train_stream",
                          "avalanche_color.runner.run") == ["avalanche_color.runner.run:1 imports "
                                                            "avalanche_color.training.resume, which is not public API"]


def test_the_package_never_imports_the_repositorys_development_tools():
    """The installed package holds the runner and its streams; the clone's benchmarks/ folder is not installed."""
    problems = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
                for path in _package_files()
                for line, name in _imported_modules(path.read_text(), _module_name(path), path.name == "__init__.py")
                if name.split(".")[0] == "benchmarks"]
    assert problems == []
