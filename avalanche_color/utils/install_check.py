"""A torch and a torchvision that do not belong together, named in one line with the command that fixes it.

torchvision's compiled operators only load beside the torch build they were made for. A machine that keeps its
own torch (a CPU build from PyTorch's index, a cluster's CUDA build) and gets PyPI's torchvision made for another
build fails deep inside timm or Avalanche with ``RuntimeError: operator torchvision::nms does not exist``.
:func:`check_torch_pair` imports torchvision first and turns that failure into an ``ImportError`` naming both
versions and the matching torchvision. The package calls it when it first imports torch (the first public name
used, ``from avalanche_color import CoLoR``), so ``import avalanche_color`` alone stays quick and loads no torch.
"""

from __future__ import annotations

import functools
import re
from importlib import metadata

PYTORCH_INDEX = "https://download.pytorch.org/whl"
BUILD_LABEL = re.compile(r"cpu|cu\d+|rocm[\d.]+|xpu")  # the builds PyTorch's index publishes, one folder each


@functools.cache
def check_torch_pair() -> None:
    """Imports torchvision; ``ImportError`` (one line: both versions and the fix) when it does not work with
    the installed torch. Any other failure to import it propagates unchanged. Runs once per process."""
    try:
        import torchvision  # noqa: F401  (its operators register against torch here)
    except RuntimeError as error:
        if "torchvision::" not in str(error):
            raise
        raise ImportError(mismatch_message(_version("torch"), _version("torchvision"), str(error))) from None


def mismatch_message(torch_version: str, torchvision_version: str, error: str) -> str:
    """The one line :func:`check_torch_pair` raises for ``torch_version`` (as its package metadata says it, so
    ``2.13.0+cpu`` for PyTorch's CPU build) and ``torchvision_version``."""
    first_line = error.strip().splitlines()[0] if error.strip() else "its operators do not load"
    return (f"torchvision {torchvision_version} does not work with the installed torch {torch_version} "
            f"({first_line}): torchvision only loads beside the torch build it was made for; keep your torch "
            f"and install its torchvision: {fix_command(torch_version)} (avalanche_color docs, Installing)")


def fix_command(torch_version: str) -> str:
    """The pip command that installs the torchvision made for ``torch_version`` and leaves torch as it is:
    from PyTorch's index of that build (``+cpu``, ``+cu126``, ...) or, for a version without a build label,
    from where torch came (PyPI's Linux wheels are CUDA builds). torch 2.N.P pairs with torchvision
    0.(N+15).P (2.13.0 with 0.28.0, 2.14.1 with 0.29.1)."""
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(?:\+(\S+))?", torch_version)
    if match is None or match[1] != "2":  # a pre-release, a source build: no published pair to name
        return (f"pip install --force-reinstall --no-deps torchvision==<the release made for torch {torch_version}, "
                f"see https://github.com/pytorch/vision#installation>")
    torchvision = f"0.{int(match[2]) + 15}.{match[3]}"
    label = match[4] or ""
    index = f" --index-url {PYTORCH_INDEX}/{label}" if BUILD_LABEL.fullmatch(label) else ""
    return f"pip install --force-reinstall --no-deps{index} torchvision=={torchvision}"


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:  # importable without package metadata (a build on the path)
        import importlib

        return str(getattr(importlib.import_module(name), "__version__", "of an unknown version"))
