"""The one strategy base of the package: every method (CoLoR, S-Prompts, L2P, SD-LoRA, InfLoRA, LoRA-Sub,
CL-LoRA) is a :class:`ConfiguredStrategy`.

A strategy lists every field of its config as a keyword argument of its own ``__init__``, with the
same default (``tests/test_signatures.py`` checks that they agree), and builds its config from them
itself, after :meth:`ConfiguredStrategy.checked_options`. The base then does, once for every method:

* construction: before the method's config is built (:meth:`~ConfiguredStrategy.checked_options`,
  :mod:`~avalanche_color.training.strategy_construction`), plugins that cannot act on the method refused
  with the reason, ``optimizer=`` refused, a ready model's own settings taken; then the model built from
  a copy of the ViT (or the ready model kept);
* what every strategy of the package is (:class:`~avalanche_color.training.strategy_base.StrategyBase`,
  the baselines' base too): the model given first, the data checks first among the plugins, the
  config's loader options in every loader, an unpadded evaluation shard per rank under torchrun;
* the numeric precision (:class:`~avalanche_color.training.precision.MixedPrecision`) and the
  per-experience cosine schedule (:class:`~avalanche_color.training.cosine_schedule.PerExperienceCosine`);
* the per-experience loop: the model adapts, then the method prepares what is new, then a fresh
  optimiser over what trains now; under torchrun the training steps run through DDP over it.

A method says what is its own: its config, model and refused plugins (class attributes),
:meth:`make_optimizer`, and where it needs them :meth:`prepare_experience`, :meth:`own_plugins`,
``forward`` and ``criterion``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Callable, ClassVar, Optional, Union

import torch
from avalanche.core import BasePlugin
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.plugins.evaluation import default_evaluator
from torch import Tensor, nn

from avalanche_color.config import LoaderOptions, Options, TrainingOptions
from avalanche_color.training.cosine_schedule import PerExperienceCosine
from avalanche_color.training.distributed import wrap_current_expert
from avalanche_color.training.precision import MixedPrecision
from avalanche_color.training.strategy_construction import (given_options, ready_model_options, refuse_optimizer,
                                                            refuse_unknown_keywords)
from avalanche_color.training.strategy_base import StrategyBase
from avalanche_color.utils.experiences import continues_experience


class ConfiguredStrategy(PerExperienceCosine, MixedPrecision, StrategyBase):
    """A ``SupervisedTemplate`` set up from one options dataclass, trained experience by experience.

    Subclasses set :attr:`config_class`, :attr:`model_class` and :attr:`model_config_class`, write
    ``__init__(self, model, *, config=None, <every option of config_class>, criterion=None,
    device="cpu", plugins=None, evaluator=default_evaluator, **kwargs)``, build their config there
    (``config_class.build(config, **options)``, the options from :meth:`checked_options`) and pass it
    on with the other arguments by name, and implement :meth:`make_optimizer`.

    Args:
        model: a timm ``VisionTransformer``: the strategy wraps a copy of it into
            :attr:`model_class`, so the ViT given stays as it was, usable by other strategies;
            or a :attr:`model_class` instance (a strategy's ``model``) to continue from: then its
            own settings (:meth:`model_settings`) apply, and one given a value other than its
            default and the model's is refused.
        config: the method's :attr:`config_class`, built by its ``__init__``.
        criterion: loss; a new ``CrossEntropyLoss`` by default.
        device, evaluator: as in Avalanche's ``SupervisedTemplate``.
        plugins: the user's plugins, after the method's own; the list is copied, never changed.
            Plugins that cannot act on the strategy (replay, distillation, regularisation, LR
            schedulers) are refused with the reason (:mod:`avalanche_color.training.plugin_compatibility`).
        template_options: other keywords of Avalanche's ``SupervisedTemplate`` (``peval_mode``, ...).
    """

    # Every method's config holds the budget and precision (TrainingOptions) and the loader options.
    config: Any
    config_class: ClassVar[type[Options]]
    # Its instances count their experts in num_experts (0 for one that adds none, as L2P's).
    model_class: ClassVar[type[nn.Module]]
    # The options the model takes: a group of config_class (e.g. LoRAOptions for CoLoR's ExpertViT).
    model_config_class: ClassVar[type[Options]]
    # The optimiser the strategy builds per experience, and the options that set it (for the refusal of optimizer=).
    optimizer_description: ClassVar[str] = "its own optimiser"
    optimizer_options: ClassVar[tuple[str, ...]] = ("lr",)
    # Whether training steps run through DDP under torchrun (a method whose forward calls the model's parts
    # itself, as L2P's prompt selection does, trains in one process).
    trains_distributed: ClassVar[bool] = True
    # Under torchrun: the model in DDP over what trains, for training steps (set per experience).
    ddp_model: Optional[nn.Module] = None

    def __init__(
        self,
        *,
        model: nn.Module,
        config: Options,
        criterion: Optional[nn.Module] = None,
        device: Union[str, torch.device] = "cpu",
        plugins: Optional[Sequence[BasePlugin]] = None,
        evaluator: Union[EvaluationPlugin, Callable[[], EvaluationPlugin]] = default_evaluator,
        template_options: Optional[Mapping[str, Any]] = None,
    ) -> None:
        cls = type(self)
        if not isinstance(model, cls.model_class):
            model = cls.build_model(model, config.group(cls.model_config_class))
        self.config = config
        self.loader_defaults: LoaderOptions = config.group(LoaderOptions)
        budget: TrainingOptions = config
        super().__init__(
            model=model,
            # A placeholder, which Avalanche's template requires: make_optimizer builds the real one per experience.
            optimizer=torch.optim.SGD(model.parameters(), lr=budget.lr),
            criterion=nn.CrossEntropyLoss() if criterion is None else criterion,
            train_mb_size=budget.train_mb_size,
            train_epochs=budget.train_epochs,
            eval_mb_size=budget.eval_mb_size,
            device=device,
            plugins=plugins,
            plugins_checked=True,
            scan_experiences=budget.check_data,
            own_plugins=self.own_plugins(),
            evaluator=evaluator,
            eval_every=budget.eval_every,
            **(template_options or {}),
        )

    @classmethod
    def checked_options(cls, model: nn.Module, config: Optional[Options], options: Mapping[str, Any],
                        plugins: Optional[Sequence[BasePlugin]],
                        template_options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """What the method's ``__init__`` builds its config from: the options given a value other than their
        default and a ready model's own settings, with Avalanche's other keywords; refused first, before
        the ViT is copied: plugins that cannot act on the method, an optimiser object, unknown keywords,
        a ready model's setting given another value."""
        template_options = dict(template_options)
        cls.refuse_incompatible_plugins(plugins)  # StrategyBase then skips it
        refuse_optimizer(cls, options, template_options)
        refuse_unknown_keywords(cls, template_options, options)
        given = given_options(cls.config_class, options)
        return {**given, **ready_model_options(cls, model, config, given)}, template_options

    # ------------------------------------------------------------------ what a method says

    @classmethod
    def model_settings(cls) -> tuple[str, ...]:
        """The options a ready :attr:`model_class` instance brings with it (its own apply)."""
        return cls.model_config_class.names()

    @classmethod
    def build_model(cls, vit: nn.Module, model_config: Options) -> nn.Module:
        """The method's model around ``vit``; a copy of it, so the ViT given stays usable (Avalanche's own
        scripts give one model object to several strategies)."""
        return cls.model_class(copy.deepcopy(vit), model_config)

    def own_plugins(self) -> list[BasePlugin]:
        """Plugins the method itself needs, after the data checks and before the user's."""
        return []

    def prepare_experience(self, **kwargs: Any) -> None:
        """After the model added an experience's expert, before its optimiser exists (InfLoRA designs ``A_t``)."""

    def make_optimizer(self, **kwargs: Any) -> None:
        """A fresh optimiser over what trains in this experience."""
        raise NotImplementedError

    # ------------------------------------------------------------------ per experience, per step

    def check_model_and_optimizer(self, **kwargs: Any) -> None:
        # What trains (a new expert, a grown head) exists only after the model adaptation, so the
        # optimiser is built after it, once per experience; the chunks of an online stream's
        # experience (with task boundaries) continue its model, optimiser and schedule.
        # Every model_class counts its experts (num_experts; L2P's, sharing one pool, has none): one
        # restored from a checkpoint has its experience's expert already, which is not prepared again.
        experts = self.model.num_experts
        self.model = self.model_adaptation()
        added = self.model.num_experts != experts
        if added:
            self.prepare_experience(**kwargs)
        if self.trains_distributed:
            self.ddp_model = wrap_current_expert(self.model)
        if added or not continues_experience(self.experience):
            self.make_optimizer(**kwargs)

    def step_model(self) -> nn.Module:
        """The module a step runs: in training under torchrun the model in DDP, else the model."""
        return self.ddp_model if self.is_training and self.ddp_model is not None else self.model

    def forward(self) -> Tensor:
        return self.step_model()(self.mb_x)
