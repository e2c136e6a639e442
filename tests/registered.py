"""The runner's registered methods built small, for the tests that every method shares.

The shared tests parametrize over the registry (:data:`avalanche_color.runner.methods.REGISTRY`), never over
a list kept here: a method registered there, or by ``register`` from a user's code, is in them at once
(``tests/test_runner_command.py`` registers a toy method and finds it among their tests).
"""

from __future__ import annotations

from typing import Any

from streams import tiny_vit

from avalanche_color.runner.config import RunConfig
from avalanche_color.runner.methods import REGISTRY
from avalanche_color.runner.run import build_method

# A budget for seconds on CPU: rank 2, k 2, one epoch of batches of 8, RanPAC's ridge 64 wide.
SMALL = dict(benchmark="digits_class", ranks=(2,), ks=(2,), epochs=1, batch_size=8, ridge_width=64)


def one_method_per_strategy() -> list[str]:
    """The first registered method of each strategy class a method names (``CoLoR`` for the whole
    CoLoR family, ``Joint-LoRA``, ``S-Prompts``, ...), in registry order; Avalanche's own strategies
    (built otherwise) are not among them."""
    seen: set[str] = set()
    names = []
    for name, entry in REGISTRY.items():
        if entry.strategy is not None and entry.strategy not in seen:
            seen.add(entry.strategy)
            names.append(name)
    return names


def build_small(name: str, num_classes: int = 4, device: Any = "cpu", **settings: Any):
    """The runner's strategy for method ``name`` on a seeded tiny ViT (``tests/streams.py``), at the
    :data:`SMALL` budget (``settings`` override it), the runner's evaluator without loggers."""
    config = RunConfig(**{**SMALL, **settings})
    return build_method(name, config, lambda classes: tiny_vit(0, num_classes=classes), num_classes, device=device)
