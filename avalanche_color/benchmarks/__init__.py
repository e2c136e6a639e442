"""The streams the comparison runner runs on, built from bundled or downloadable data.

* ``registry``: every benchmark by name (:data:`BENCHMARKS`), what it needs and builds.
* ``digits``: class- and domain-incremental streams from scikit-learn's bundled digits (no download).
* ``pacs`` (PACS by domain) and ``tiny_imagenet`` (Tiny-ImageNet's layout, Split Tiny-ImageNet by class):
  from a zip file or folder (``--data``, or the ``AVALANCHE_COLOR_DATA`` folder; Tiny-ImageNet downloads
  where it can).
* ``paper``: the paper's Split CIFAR-100, CORe50 (NI) and DomainNet, from a data folder.
* ``stream_building`` (what the streams share; a validation stream carved from a benchmark),
  ``archives`` (reading and caching the images), ``transforms`` (the ViT input pipelines).

Importing this folder imports no torch: the registry names the benchmarks, and the stream
builders are imported when a stream is built (or when named here, e.g. ``benchmarks.split_cifar100``;
``benchmarks.pacs`` is the module, whose builder is ``benchmarks.pacs.pacs``).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from avalanche_color.benchmarks.registry import BENCHMARKS, BenchmarkSpec, benchmark_spec

# Stream builders, imported on first use (each module imports torch and Avalanche).
_BUILDERS = {"split_tiny_imagenet": "tiny_imagenet", "split_cifar100": "paper", "core50_ni": "paper",
             "domainnet": "paper", "class_incremental_stream": "digits", "domain_incremental_stream": "digits",
             "digits_split": "digits"}

__all__ = ["BENCHMARKS", "BenchmarkSpec", "benchmark_spec", "pacs", *_BUILDERS]


def __getattr__(name: str) -> Any:
    if name in _BUILDERS:
        return getattr(import_module(f"avalanche_color.benchmarks.{_BUILDERS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
