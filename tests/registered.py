"""The runner's registered methods built small, for the tests that every method shares.

The shared tests parametrize over the registry (:data:`avalanche_color.runner.methods.REGISTRY`), never over
a list kept here: a method registered there, or by ``register`` from a user's code, is in them at once
(``tests/test_runner_command.py`` registers a toy method and finds it among their tests).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import torch
from helpers import quiet_evaluator
from streams import tiny_vit

from avalanche_color.runner.config import RunConfig
from avalanche_color.runner.methods import REGISTRY, MethodRun
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


def build_small_with(name: str, *, options: Optional[dict[str, Any]] = None, vit_dtype: torch.dtype = torch.float32,
                     plugins: Sequence[Any] = (), evaluator: Any = None, eval_mb_size: int = 64, num_classes: int = 4,
                     **settings: Any):
    """:func:`build_small`'s strategy with what a test adds to it: ``options`` over the method's own (a learning
    rate, ...), the tiny ViT cast to ``vit_dtype``, the test's ``plugins`` and ``evaluator`` (default: accuracy
    and routing accuracy, no loggers) in place of the runner's, evaluation batches of ``eval_mb_size``."""
    config = RunConfig(**{**SMALL, **settings})
    entry = REGISTRY[name]
    run = MethodRun(config=config, rank=config.ranks[0] if entry.lora else None,
                    k=config.ks[0] if entry.prototypes else None, num_classes=num_classes,
                    backbone=lambda classes: tiny_vit(0, num_classes=classes).to(vit_dtype),
                    strategy_options=dict(train_mb_size=config.batch_size, train_epochs=config.epochs,
                                          eval_mb_size=eval_mb_size, plugins=list(plugins),
                                          evaluator=quiet_evaluator() if evaluator is None else evaluator))
    return entry.build_strategy(run, {**entry.options(run), **(options or {})})
