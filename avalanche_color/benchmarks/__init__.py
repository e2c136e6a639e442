"""The streams the comparison runner runs on, built from bundled or downloadable data.

* ``digits``: class- and domain-incremental streams from scikit-learn's bundled digits (no download).
* ``offline``: PACS by domain and Split Tiny-ImageNet by class, from a zip file or folder
  (``--data``, or the ``AVALANCHE_COLOR_DATA`` folder; Tiny-ImageNet downloads where it can).
* ``paper``: the paper's Split CIFAR-100, CORe50 (NI) and DomainNet, from a data folder.
* ``registry``: every benchmark by name (:data:`BENCHMARKS`), what it needs and builds.
* ``archives`` (reading and caching the images), ``transforms`` (the ViT input pipelines),
  ``tiny_imagenet`` (its official layout).

Importing this folder imports no torch: the registry names the benchmarks, and the stream
builders are imported when a stream is built (or when named here, e.g. ``benchmarks.pacs``).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from avalanche_color.benchmarks.registry import BENCHMARKS, BenchmarkSpec, benchmark_spec

# Stream builders, imported on first use (each module imports torch and Avalanche).
_BUILDERS = {"pacs": "offline", "split_tiny_imagenet": "offline", "split_cifar100": "paper", "core50_ni": "paper",
             "domainnet": "paper", "class_incremental_stream": "digits", "domain_incremental_stream": "digits",
             "digits_split": "digits"}

__all__ = ["BENCHMARKS", "BenchmarkSpec", "benchmark_spec", *_BUILDERS]


def __getattr__(name: str) -> Any:
    if name in _BUILDERS:
        return getattr(import_module(f"avalanche_color.benchmarks.{_BUILDERS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
