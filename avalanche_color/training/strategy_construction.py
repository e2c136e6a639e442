"""How a :class:`~avalanche_color.training.configured_strategy.ConfiguredStrategy`'s keywords become the
options its config is built from: each function checks or replaces one thing, before anything is copied
or adapted."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Optional, Protocol

import torch
from avalanche.training.templates import SupervisedTemplate
from torch import nn

from avalanche_color.config import Options


class StrategyClass(Protocol):
    """What construction reads of a strategy class (a ``ConfiguredStrategy`` subclass), named here by what
    it has so that this module never imports the class that calls it."""

    __name__: str
    config_class: type[Options]
    model_class: type[nn.Module]
    model_config_class: type[Options]
    optimizer_description: str
    optimizer_options: tuple[str, ...]

    def model_settings(self) -> tuple[str, ...]: ...


_UNSET = object()


def refuse_optimizer(strategy: StrategyClass, options: Mapping[str, Any],
                     template_options: Mapping[str, Any]) -> None:
    """``Naive(model, optimizer=...)`` is Avalanche's habit; here the optimiser is made per experience.

    Refused: an ``optimizer=`` given to a method that has no such option, and a torch optimiser given to
    one whose ``optimizer`` option names its choice (``"sgd"``, ``"adam"``)."""
    given = template_options.get("optimizer", options.get("optimizer", _UNSET))
    if "optimizer" not in template_options and not isinstance(given, torch.optim.Optimizer):
        return
    name = strategy.__name__
    raise TypeError(
        f"{name} builds its own optimiser per experience ({strategy.optimizer_description}), so it takes no "
        f"optimiser object as optimizer=, got {type(given).__name__}; set {', '.join(strategy.optimizer_options)} "
        f"instead, or subclass {name} and override make_optimizer"
    )


def refuse_unknown_keywords(strategy: StrategyClass, template_options: Mapping[str, Any],
                            options: Mapping[str, Any]) -> None:
    """A keyword that is neither an option of the method nor one of Avalanche's template is refused by name."""
    accepted: set[str] = set()
    for cls in SupervisedTemplate.__mro__:  # Avalanche's keywords (peval_mode, ...)
        parameters = inspect.signature(inspect.unwrap(cls.__init__)).parameters.values()
        accepted.update(p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    unknown = sorted(set(template_options) - accepted)
    if unknown:
        raise TypeError(
            f"{strategy.__name__} got unexpected keyword arguments {unknown}; its options are "
            f"{', '.join(options)} (see {strategy.config_class.__name__}), and Avalanche's "
            f"SupervisedTemplate keywords"
        )


def ready_model_options(strategy: StrategyClass, model: nn.Module, config: Optional[Options],
                        given: Mapping[str, Any]) -> dict[str, Any]:
    """A ready ``model_class`` instance's own settings (``strategy.model_settings()``), which its config takes;
    empty for a plain ViT. One given, or set in ``config``, to another value is refused."""
    if not isinstance(model, strategy.model_class):
        return {}
    own = {name: getattr(model.config, name) for name in strategy.model_settings()}
    conflicting = sorted(name for name in own if name in given and given[name] != own[name])
    if isinstance(config, strategy.config_class):
        conflicting += sorted(name for name in own if name not in conflicting and getattr(config, name) != own[name])
    if conflicting:
        raise ValueError(
            f"model is already a configured {strategy.model_class.__name__} with its own settings; leave "
            f"{conflicting} unset (the model's: {', '.join(f'{name}={own[name]!r}' for name in conflicting)})"
        )
    return own


def given_options(config_class: type[Options], options: Mapping[str, Any]) -> dict[str, Any]:
    """The options whose value is not their default: those a caller set (a strategy's keywords carry
    every option). The type counts too: ``kmeans_seed=False`` is not the default 0."""
    defaults = config_class.defaults()
    return {name: value for name, value in options.items()
            if not (type(value) is type(defaults[name]) and value == defaults[name])}
