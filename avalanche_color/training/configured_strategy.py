"""The call every strategy of the package shares: ``Strategy(model, config=None, **options)``.

A strategy names its options dataclass (:mod:`avalanche_color.config`) and its
model class; options given as keywords replace the config's fields, and keywords
that are not options go to Avalanche's ``SupervisedTemplate`` (``peval_mode``, ...).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import typing
from collections.abc import Sequence
from typing import Any, Callable, ClassVar, Optional, Union

import torch
from avalanche.core import BasePlugin
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.plugins.evaluation import default_evaluator
from avalanche.training.templates import SupervisedTemplate
from torch import nn

from avalanche_color.config import LoaderOptions, Options
from avalanche_color.training.loaders import loader_options
from avalanche_color.training.plugin_compatibility import refuse_incompatible_plugins


class ConfiguredStrategy(SupervisedTemplate):
    """A ``SupervisedTemplate`` set up from one options dataclass.

    Subclasses set :attr:`config_class` and :attr:`model_class` and implement
    :meth:`first_optimizer` (a placeholder: the real one is made per experience)
    and, if they add plugins of their own, :meth:`own_plugins`.

    Args:
        model: a timm ``VisionTransformer``: the strategy wraps a copy of it into
            :attr:`model_class`, so the ViT given stays as it was, usable by other
            strategies; or a :attr:`model_class` instance (a strategy's ``model``) to
            continue from: then its own model options (those of the model's options
            class, e.g. ``LoRAOptions`` for CoLoR) apply and must not be given again.
        config: a :attr:`config_class`; keyword options replace its fields.
        criterion: loss; a new ``CrossEntropyLoss`` by default.
        device, evaluator: as in Avalanche's ``SupervisedTemplate``.
        plugins: the user's plugins; the list is copied, never changed. Plugins that cannot act
            on the strategy (replay, distillation, regularisation, LR schedulers) are refused
            with the reason (:mod:`avalanche_color.training.plugin_compatibility`).
        **options: fields of :attr:`config_class`, and any other keyword of
            Avalanche's ``SupervisedTemplate``.
    """

    config_class: ClassVar[type[Options]]
    model_class: ClassVar[type[nn.Module]]
    # Avalanche plugins this strategy refuses, by class name, with the reason (see plugin_compatibility).
    incompatible_plugins: ClassVar[dict[str, str]] = {}
    # The optimiser the strategy builds per experience, and the options that set it (for the refusal of optimizer=).
    optimizer_description: ClassVar[str] = "its own optimiser"
    optimizer_options: ClassVar[tuple[str, ...]] = ("lr",)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)  # Avalanche wraps __init__ to warn about positional arguments;
        cls.__init__ = inspect.unwrap(cls.__init__)  # Strategy(model, ...) is this package's documented call
        if "config_class" in cls.__dict__:
            # help(), inspect.signature and IPython show every option, read from the config (declared once there).
            cls.__signature__ = strategy_signature(cls.config_class)  # type: ignore[attr-defined]

    def __init__(
        self,
        model: nn.Module,
        config: Optional[Options] = None,
        *,
        criterion: Optional[nn.Module] = None,
        device: Union[str, torch.device] = "cpu",
        plugins: Optional[Sequence[BasePlugin]] = None,
        evaluator: Union[EvaluationPlugin, Callable[[], EvaluationPlugin]] = default_evaluator,
        **options: Any,
    ) -> None:
        refuse_incompatible_plugins(type(self).__name__, plugins or (), self.incompatible_plugins)
        self._refuse_optimizer(options)  # before the model is copied and adapted
        self._refuse_unknown_keywords(options)
        own = {name: options.pop(name) for name in list(options) if name in self.config_class.names()}
        model, self.config = configured_model(model, self.model_class, self.config_class, config, own)
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
            **options,
        )

    def _refuse_optimizer(self, options: dict[str, Any]) -> None:
        # Naive(model, optimizer=...) is Avalanche's habit; here the optimiser is made per experience.
        if "optimizer" in options:
            name = type(self).__name__
            raise TypeError(
                f"{name} builds its own optimiser per experience ({self.optimizer_description}), so it takes no "
                f"optimizer=, got {type(options['optimizer']).__name__}; set "
                f"{', '.join(self.optimizer_options)} instead, or subclass {name} and override make_optimizer"
            )

    def _refuse_unknown_keywords(self, options: dict[str, Any]) -> None:
        accepted = set(self.config_class.names())
        for cls in SupervisedTemplate.__mro__:  # Avalanche's keywords (peval_mode, ...)
            parameters = inspect.signature(inspect.unwrap(cls.__init__)).parameters.values()
            accepted.update(p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        unknown = sorted(set(options) - accepted)
        if unknown:
            raise TypeError(
                f"{type(self).__name__} got unexpected keyword arguments {unknown}; its options are "
                f"{', '.join(self.config_class.names())} (see {self.config_class.__name__}), and Avalanche's "
                f"SupervisedTemplate keywords"
            )

    def train(self, experiences: Any, eval_streams: Optional[Sequence[Any]] = None, **kwargs: Any) -> Any:
        """Avalanche's ``train``; the config's loader options (``num_workers``, ...) apply unless given here."""
        return super().train(experiences, eval_streams, **self._with_loader_options(kwargs))

    def eval(self, exp_list: Any, **kwargs: Any) -> Any:
        """Avalanche's ``eval``; the config's loader options (``num_workers``, ...) apply unless given here."""
        return super().eval(exp_list, **self._with_loader_options(kwargs))

    def _with_loader_options(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        # Avalanche hands these keywords to its loaders and to every plugin callback (prototype
        # fitting, the data scan), so one value reaches every loader of the call.
        if not isinstance(self.config, LoaderOptions):
            return kwargs
        return {**kwargs, **loader_options(kwargs, self.config).loader_options()}

    def first_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        raise NotImplementedError

    def own_plugins(self) -> list[BasePlugin]:
        """Plugins the method itself needs, placed before the user's."""
        return []


def strategy_signature(config_class: type[Options]) -> inspect.Signature:
    """``Strategy(model, config=None, *, <every option of config_class>, criterion, device, plugins,
    evaluator, **kwargs)``: the call :meth:`ConfiguredStrategy.__init__` accepts, each option with
    its type and default as declared in ``config_class``."""
    base = inspect.signature(ConfiguredStrategy.__init__).parameters
    hints = typing.get_type_hints(config_class)
    options = [inspect.Parameter(spec.name, inspect.Parameter.KEYWORD_ONLY, default=spec.default,
                                 annotation=hints[spec.name])
               for spec in dataclasses.fields(config_class) if spec.init]
    avalanche = [base[name].replace(annotation=hint) for name, hint in typing.get_type_hints(
        ConfiguredStrategy.__init__).items() if name in ("criterion", "device", "plugins", "evaluator")]
    return inspect.Signature([
        base["model"].replace(annotation=nn.Module),
        base["config"].replace(annotation=Optional[config_class]),
        *options,
        *avalanche,
        inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD, annotation=Any),  # Avalanche's other keywords
    ], return_annotation=None)


def configured_model(model: nn.Module, model_class: type[nn.Module], config_class: type[Options],
                     config: Optional[Options], options: dict[str, Any]) -> tuple[nn.Module, Any]:
    """The strategy's model and its full config.

    A plain ViT becomes ``model_class(copy of model, config)``: the models adapt and freeze
    the ViT they wrap, and the caller's ViT stays usable (Avalanche's own scripts give one
    model object to several strategies). A ``model_class`` instance is kept, and its own
    model options fill the config; giving them again is refused.
    """
    if not isinstance(model, model_class):
        config = config_class.build(config, **options)
        return model_class(copy.deepcopy(model), config), config
    # The model's own options: the fields of its options class (model.config may be the whole strategy config).
    model_options = {name: getattr(model.config, name) for name in typing.get_type_hints(model_class)["config"].names()}
    given = sorted(set(options) & set(model_options))
    if config is not None:
        given += sorted(name for name, value in model_options.items()
                        if name not in given and getattr(config, name) != value)
    if given:
        raise ValueError(
            f"model is already a configured {model_class.__name__} with its own settings; leave {given} unset"
        )
    return model, config_class.build(config, **{**options, **model_options})


# Avalanche wrapped this class's own __init__ too, when it was defined.
ConfiguredStrategy.__init__ = inspect.unwrap(ConfiguredStrategy.__init__)  # type: ignore[method-assign]
