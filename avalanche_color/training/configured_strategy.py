"""What every strategy of the package shares: its config, built once, each part given its own options.

A strategy (``CoLoR``, ``SPrompts``, ``L2P``) lists every field of its config as a keyword
argument of its own ``__init__``, with the same default (``tests/test_signatures.py`` checks
that they agree), and passes them here by name. This class builds the config once, gives the
model its model options (``config.group(model_config_class)``), the loaders their
``LoaderOptions``, Avalanche's ``SupervisedTemplate`` the budget, and the training and evaluation
loops the ``precision`` (:class:`~avalanche_color.training.precision.MixedPrecision`).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Mapping, Sequence
from typing import Any, Callable, ClassVar, Optional, Union

import torch
from avalanche.core import BasePlugin
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.plugins.evaluation import default_evaluator
from avalanche.training.templates import SupervisedTemplate
from torch import nn

from avalanche_color.config import LoaderOptions, Options, RoutingOptions, TrainingOptions
from avalanche_color.training.precision import MixedPrecision
from avalanche_color.training.strategy_parts import LoaderDefaults, ModelFirst
from avalanche_color.training.plugin_compatibility import refuse_incompatible_plugins
from avalanche_color.utils.deprecation import warn_deprecated


class ConfiguredStrategy(ModelFirst, LoaderDefaults, MixedPrecision, SupervisedTemplate):
    """A ``SupervisedTemplate`` set up from one options dataclass.

    Subclasses set :attr:`config_class`, :attr:`model_class` and :attr:`model_config_class`, write
    ``__init__(self, model, *, config=None, <every option of config_class>, criterion=None,
    device="cpu", plugins=None, evaluator=default_evaluator, **kwargs)`` and pass those arguments on
    by name, and implement :meth:`first_optimizer` (a placeholder: the real one is made per
    experience) and, if they add plugins of their own, :meth:`own_plugins`.

    Args:
        model: a timm ``VisionTransformer``: the strategy wraps a copy of it into
            :attr:`model_class`, so the ViT given stays as it was, usable by other strategies;
            or a :attr:`model_class` instance (a strategy's ``model``) to continue from: then its
            own options (those of :attr:`model_config_class`) apply, and one given a value other
            than its default and the model's is refused.
        config: a whole :attr:`config_class`, or None; options given with a value other than their
            default replace its fields.
        options: the value of every option of :attr:`config_class`, by name (the subclass's keywords).
        criterion: loss; a new ``CrossEntropyLoss`` by default.
        device, evaluator: as in Avalanche's ``SupervisedTemplate``.
        plugins: the user's plugins; the list is copied, never changed. Plugins that cannot act
            on the strategy (replay, distillation, regularisation, LR schedulers) are refused
            with the reason (:mod:`avalanche_color.training.plugin_compatibility`).
        template_options: other keywords of Avalanche's ``SupervisedTemplate`` (``peval_mode``, ...).
    """

    # Every method's config holds the budget (TrainingOptions) and the loader options.
    config: TrainingOptions
    config_class: ClassVar[type[TrainingOptions]]
    model_class: ClassVar[type[nn.Module]]
    # The options the model takes: a group of config_class (e.g. LoRAOptions for CoLoR's ExpertViT).
    model_config_class: ClassVar[type[Options]]
    # Avalanche plugins this strategy refuses, by class name, with the reason (see plugin_compatibility).
    incompatible_plugins: ClassVar[dict[str, str]] = {}
    # The optimiser the strategy builds per experience, and the options that set it (for the refusal of optimizer=).
    optimizer_description: ClassVar[str] = "its own optimiser"
    optimizer_options: ClassVar[tuple[str, ...]] = ("lr",)

    def __init__(
        self,
        *,
        model: nn.Module,
        config: Optional[Options],
        options: Mapping[str, Any],
        criterion: Optional[nn.Module] = None,
        device: Union[str, torch.device] = "cpu",
        plugins: Optional[Sequence[BasePlugin]] = None,
        evaluator: Union[EvaluationPlugin, Callable[[], EvaluationPlugin]] = default_evaluator,
        template_options: Optional[Mapping[str, Any]] = None,
    ) -> None:
        template_options = dict(template_options or {})
        refuse_incompatible_plugins(type(self).__name__, plugins or (), self.incompatible_plugins)
        self._refuse_optimizer(template_options)  # before the model is copied and adapted
        options = self._replace_routing(options, template_options)
        self._refuse_unknown_keywords(template_options, options)
        model, self.config = self._configured_model(model, config, options)
        self.loader_defaults: LoaderOptions = self.config.group(LoaderOptions)
        config = self.config
        super().__init__(
            model=model,
            optimizer=self.first_optimizer(model),
            criterion=nn.CrossEntropyLoss() if criterion is None else criterion,
            train_mb_size=config.train_mb_size,
            train_epochs=config.train_epochs,
            eval_mb_size=config.eval_mb_size,
            device=device,
            plugins=[*self.own_plugins(), *(plugins or ())],
            evaluator=evaluator,
            eval_every=config.eval_every,
            **template_options,
        )

    def _refuse_optimizer(self, template_options: dict[str, Any]) -> None:
        # Naive(model, optimizer=...) is Avalanche's habit; here the optimiser is made per experience.
        if "optimizer" in template_options:
            name = type(self).__name__
            raise TypeError(
                f"{name} builds its own optimiser per experience ({self.optimizer_description}), so it takes no "
                f"optimizer=, got {type(template_options['optimizer']).__name__}; set "
                f"{', '.join(self.optimizer_options)} instead, or subclass {name} and override make_optimizer"
            )

    def _replace_routing(self, options: Mapping[str, Any], template_options: dict[str, Any]) -> dict[str, Any]:
        """``options`` with the deprecated ``routing=`` of earlier versions replaced by what it means now."""
        if "routing" not in template_options or not issubclass(self.config_class, RoutingOptions):
            return dict(options)
        routing = template_options.pop("routing")
        given = _given(self.config_class, options)
        replaced = RoutingOptions.without_routing({**given, "routing": routing}, warn=False)
        new = ", ".join(f"{name}={value!r}" for name, value in replaced.items() if given.get(name, _UNSET) != value)
        warn_deprecated(f"the option routing={routing!r} is deprecated: use {new or 'routing_features and router'}")
        return {**options, **replaced}

    def _refuse_unknown_keywords(self, template_options: dict[str, Any], options: Mapping[str, Any]) -> None:
        accepted: set[str] = set()
        for cls in SupervisedTemplate.__mro__:  # Avalanche's keywords (peval_mode, ...)
            parameters = inspect.signature(inspect.unwrap(cls.__init__)).parameters.values()
            accepted.update(p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        unknown = sorted(set(template_options) - accepted)
        if unknown:
            raise TypeError(
                f"{type(self).__name__} got unexpected keyword arguments {unknown}; its options are "
                f"{', '.join(options)} (see {self.config_class.__name__}), and Avalanche's "
                f"SupervisedTemplate keywords"
            )

    def _configured_model(self, model: nn.Module, config: Optional[Options],
                          options: Mapping[str, Any]) -> tuple[nn.Module, TrainingOptions]:
        """The strategy's model and its config, built once.

        A plain ViT becomes ``model_class(copy of model, the config's model options)``: the models
        adapt and freeze the ViT they wrap, and the caller's ViT stays usable (Avalanche's own
        scripts give one model object to several strategies). A ``model_class`` instance is kept,
        and its own options fill the config.
        """
        given = _given(self.config_class, options)
        if not isinstance(model, self.model_class):
            config = self.config_class(**options) if config is None else self.config_class.build(config, **given)
            return self.model_class(copy.deepcopy(model), config.group(self.model_config_class)), config
        own = {name: getattr(model.config, name) for name in self.model_config_class.names()}
        conflicting = sorted(name for name in own if name in given and given[name] != own[name])
        if config is not None:
            conflicting += sorted(name for name in own
                                  if name not in conflicting and getattr(config, name) != own[name])
        if conflicting:
            raise ValueError(
                f"model is already a configured {self.model_class.__name__} with its own settings; leave "
                f"{conflicting} unset (the model's: {', '.join(f'{name}={own[name]!r}' for name in conflicting)})"
            )
        if config is None:
            return model, self.config_class(**{**options, **own})
        return model, self.config_class.build(config, **{**given, **own})

    def first_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        raise NotImplementedError

    def own_plugins(self) -> list[BasePlugin]:
        """Plugins the method itself needs, placed before the user's."""
        return []


_UNSET = object()


def _given(config_class: type[Options], options: Mapping[str, Any]) -> dict[str, Any]:
    """The options whose value is not their default: those a caller set (a strategy's keywords carry
    every option). The type counts too: ``kmeans_seed=False`` is not the default 0."""
    defaults = config_class.defaults()
    return {name: value for name, value in options.items()
            if not (type(value) is type(defaults[name]) and value == defaults[name])}
