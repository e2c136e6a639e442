"""The strategy base of the package, from ``__init__`` to ``training_epoch``, and the parts it holds.

* :class:`StrategyBase`: what every strategy of the package is, the baselines included: an Avalanche
  ``SupervisedTemplate`` (or ``JointTraining``) built from one config. Each strategy writes its own ``__init__``
  in its own file, every option a keyword with its type and the config's default (``rank: int =
  CoLoRConfig.rank``, shown as ``rank: int = 64``), and hands them to this base's ``__init__``, which checks the
  keywords (plugins that cannot act on the strategy refused with the reason, ``optimizer=`` refused, unknown
  keywords refused by name, a ready model's own settings taken), builds the config from those given
  (``config_class.build(config, **options)``) and the model (:meth:`~StrategyBase.make_model`), and passes
  Avalanche's keywords on to its template. It then holds what every strategy shares: the data checks first
  among the plugins and the check that each experience learned something next, the loader options in every
  loader, the training and evaluation loops under the chosen numeric precision (:class:`MixedPrecision`, held
  as ``self.precision``), the learning-rate schedule of the experience (``self.lr_scheduler``, made by the
  ``restart_*`` methods) stepped after every optimiser step, an unpadded evaluation shard per rank under
  torchrun, and the per-experience loop of a method: the model adapts, then the method prepares what is new,
  then a fresh optimiser over what trains now; under torchrun the training steps run through DDP over it. A
  method says what is its own: its config, model and refused plugins (class attributes),
  :meth:`~StrategyBase.make_optimizer`, and where it needs them :meth:`~StrategyBase.prepare_experience`,
  :meth:`~StrategyBase.own_plugins`, ``forward`` and ``criterion``. A baseline says what it builds instead
  (:meth:`~StrategyBase.make_model`, :meth:`~StrategyBase.template_settings`, its own loop).
* :class:`RoutedExpertsTemplate`: the training CoLoR and S-Prompts share over it (one expert per
  experience, SGD and a cosine schedule, the prototype router).

In the file's order: :class:`StrategyBase`, the plugins a strategy refuses and why
(:func:`incompatible_plugin_reasons`), :class:`RoutedExpertsTemplate`, then the parts the classes hold or
call: the numeric precision (:class:`MixedPrecision`) and the checks of a strategy's keywords before its
config is built.
"""

import copy
import inspect
import math
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from types import MappingProxyType
from typing import Any, Callable, ClassVar, Optional, Union

import torch
from avalanche.core import BasePlugin
from avalanche.distributed import DistributedHelper
from avalanche.training import plugins as avalanche_plugins
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.plugins.evaluation import default_evaluator
from avalanche.training.templates import SupervisedTemplate
from avalanche.training.templates.base import BaseTemplate
from torch import Tensor, nn
from torch.optim import SGD
from torch.optim.lr_scheduler import CosineAnnealingLR, LambdaLR, LRScheduler

from avalanche_color.config import (PRECISIONS, LoaderOptions, Options, PrecisionOptions, PrototypeOptions,
                                    RoutedExpertsConfig, TrainingOptions)
from avalanche_color.experts.routed_vit import RoutedExpertViT
from avalanche_color.training.data_checks import DataChecksPlugin
from avalanche_color.training.distributed import (eval_loader, eval_row_counts, gather_eval_batch, is_distributed,
                                                  wrap_current_expert)
from avalanche_color.training.learning_check import LearningCheckPlugin
from avalanche_color.training.loaders import loader_options
from avalanche_color.training.router_fitting import PrototypeRouterPlugin
from avalanche_color.utils.checks import OptionDefault, one_of, require, usable_device
from avalanche_color.utils.experiences import continues_experience, origin_experience

# The evaluator a strategy takes: Avalanche's EvaluationPlugin, or a factory of one.
Evaluator = Union[EvaluationPlugin, Callable[[], EvaluationPlugin]]

# The keywords every method takes beside its model, config and options, and what they are; the baselines take
# device, plugins and evaluator. Each strategy's __init__ declares them; StrategyBase's describes them.
STRATEGY_KEYWORDS = {
    "criterion": "the loss; a new ``CrossEntropyLoss`` by default.",
    "device": "where the model trains and evaluates.",
    "plugins": "Avalanche plugins, after the strategy's own (the list is copied, never changed); those that "
               "cannot act on the strategy (replay, distillation, regularisation, LR schedulers) are refused "
               "with the reason.",
    "evaluator": "Avalanche's ``EvaluationPlugin``, or a factory of one.",
}


class StrategyBase(SupervisedTemplate):
    """An Avalanche ``SupervisedTemplate`` as every strategy of the package builds it, from one config.

    A strategy's own ``__init__`` (``CoLoR.__init__``, in its file) declares the model, ``config`` and every
    option of its :attr:`config_class` as keywords, and hands them on to this class's. Its arguments, the same
    for every strategy:

    * ``model``: a timm ``VisionTransformer``, of which a method builds its :attr:`model_class` on a copy (the
      ViT given stays as it was, usable by other strategies); or a :attr:`model_class` instance (a strategy's
      ``model``) to continue from: its own settings (:meth:`model_settings`) then apply, and one given another
      value is refused. A baseline adapts or freezes a copy of the ViT.
    * ``config``: all options as one :attr:`config_class`; an option given beside it replaces its field.
    * the options: the fields of :attr:`config_class`, each with its doc there; one left at its default
      (:class:`~avalanche_color.utils.checks.OptionDefault`) is not given.
    * ``criterion``, ``device``, ``plugins``, ``evaluator``: as :data:`STRATEGY_KEYWORDS` says (a baseline
      takes no ``criterion``). The plugins named in :attr:`incompatible_plugins` are refused with the reason;
      a :class:`~avalanche_color.DataChecksPlugin` comes first (it scans each training experience's samples
      before anything changes for it when the config's ``check_data`` is set; empty experiences, non-finite
      evaluation pixels and a non-finite loss are refused either way), a
      :class:`~avalanche_color.LearningCheckPlugin` next (it warns,
      :class:`~avalanche_color.ExpertLearnedNothing`, after an experience whose training accuracy is no
      better than chance or whose loss did not fall), then the strategy's own (:meth:`own_plugins`), then the
      user's.
    * ``**template_options``: other keywords of Avalanche's template (``peval_mode``, ...); any other keyword
      is refused by name.

    The config's ``precision`` (a :class:`~avalanche_color.config.PrecisionOptions` field: ``"32-true"``,
    ``"bf16-mixed"`` or ``"16-mixed"``) sets the numeric precision of training and evaluation
    (:class:`MixedPrecision`, ``self.precision``); its loader options (:class:`~avalanche_color.config.
    LoaderOptions`) apply to every loader.
    """

    # The strategy's options, each declared once (a method's config, a baseline's options).
    config_class: ClassVar[type[Options]]
    config: Any
    # A method's model (its instances count their experts in num_experts: 0 for one that adds none, as L2P's)
    # and the options it takes: a group of config_class (e.g. LoRAOptions for CoLoR's ExpertViT).
    model_class: ClassVar[type[nn.Module]]
    model_config_class: ClassVar[type[Options]]
    # The Avalanche template whose keywords pass through (**template_options).
    avalanche_template: ClassVar[type[SupervisedTemplate]] = SupervisedTemplate
    # Avalanche plugins this strategy refuses, by class name, with the reason (incompatible_plugin_reasons).
    incompatible_plugins: ClassVar[dict[str, str]] = {}
    # The optimiser the strategy builds per experience, and the options that set it (for the refusal of optimizer=).
    optimizer_description: ClassVar[str] = "its own optimiser"
    optimizer_options: ClassVar[tuple[str, ...]] = ("lr",)
    # Whether training steps run through DDP under torchrun (a method whose forward calls the model's parts
    # itself, as L2P's prompt selection does, trains in one process).
    trains_distributed: ClassVar[bool] = True
    # The options of every loader of train and eval, unless the call gives them (train, eval).
    loader_defaults: LoaderOptions = LoaderOptions()
    # The learning-rate schedule of the experience's optimiser, stepped after each of its steps (restart_*).
    lr_scheduler: Optional[LRScheduler] = None
    # Under torchrun: the model in DDP over what trains, for training steps (set per experience).
    ddp_model: Optional[nn.Module] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Avalanche's BaseTemplate.__init_subclass__ wraps every subclass's __init__: it warns on each call when
        # the __init__ declares a positional parameter, as Strategy(model, config) does here by design, and
        # refuses unknown keywords with its own message before the strategy's. Skipping it (and only it), each
        # strategy's __init__ stays the one written in its file.
        super(BaseTemplate, cls).__init_subclass__(**kwargs)

    def __init__(self, *, model: nn.Module, config: Optional[Options], options: Mapping[str, Any],
                 criterion: Optional[nn.Module] = None, device: Union[str, torch.device] = "cpu",
                 plugins: Optional[Sequence[BasePlugin]] = None, evaluator: Evaluator = default_evaluator,
                 template_options: Mapping[str, Any] = MappingProxyType({})) -> None:
        # Keywords only, Avalanche's keywords in one mapping: this __init__ keeps Avalanche's wrapper (see
        # __init_subclass__), which then sees none of the user's keywords before they are checked here.
        options = self.checked_options(model, config, plugins, options, template_options)
        self.config = config = self.config_class.build(config, **options)
        model = self.make_model(model)
        require("device", device, usable_device)  # torch's own message would name neither the option nor the value
        if isinstance(config, LoaderOptions):
            self.loader_defaults = config.group(LoaderOptions)
        self.precision = MixedPrecision(config.precision if isinstance(config, PrecisionOptions) else "32-true")
        # Under torchrun, every rank's row count of each evaluation batch (make_eval_dataloader).
        self._eval_row_counts: Iterator[list[int]] = iter(())
        # Bad data is refused first, before any other plugin or the model adaptation acts on it.
        checks = DataChecksPlugin(scan_experiences=self.scans_experiences())
        # Then a word after each experience whose training learned nothing (a finite loss that stays at chance).
        super().__init__(model=model, criterion=nn.CrossEntropyLoss() if criterion is None else criterion,
                         device=device, evaluator=evaluator,
                         plugins=[checks, LearningCheckPlugin(), *self.own_plugins(), *(plugins or ())],
                         **self.template_settings(model), **template_options)

    @classmethod
    def checked_options(cls, model: nn.Module, config: Optional[Options], plugins: Optional[Sequence[BasePlugin]],
                        options: Mapping[str, Any], template_options: Mapping[str, Any]) -> dict[str, Any]:
        """The options given (those not left at their :class:`~avalanche_color.utils.checks.OptionDefault`) and a
        ready model's own settings, which the config is built from; refused first, before the ViT is copied:
        plugins that are no list or cannot act on the strategy, an optimiser object, unknown keywords, a ready
        model's setting given another value."""
        given = {name: value for name, value in options.items() if not isinstance(value, OptionDefault)}
        require("plugins", plugins, plugin_list)
        cls.refuse_incompatible_plugins(plugins)
        refuse_optimizer(cls, given, template_options)
        refuse_unknown_keywords(cls, cls.config_class, template_options, cls.avalanche_template)
        return {**given, **ready_model_options(cls, model, config, given)}

    @classmethod
    def refuse_incompatible_plugins(cls, plugins: Optional[Iterable[BasePlugin]]) -> None:
        """Raise a ``ValueError`` naming the first of ``plugins`` that :attr:`incompatible_plugins`
        refuses, and why."""
        refuse_incompatible_plugins(cls.__name__, plugins or (), cls.incompatible_plugins)

    # ------------------------------------------------------------------ what a strategy says

    @classmethod
    def model_settings(cls) -> tuple[str, ...]:
        """The options a ready :attr:`model_class` instance brings with it (its own apply)."""
        return cls.model_config_class.names()

    @classmethod
    def build_model(cls, vit: nn.Module, model_config: Options) -> nn.Module:
        """The method's model around ``vit``; a copy of it, so the ViT given stays usable (Avalanche's own
        scripts give one model object to several strategies)."""
        return cls.model_class(copy.deepcopy(vit), model_config)

    def make_model(self, model: nn.Module) -> nn.Module:
        """The model the strategy trains: ``model`` itself when it is a ready :attr:`model_class` instance, else
        :meth:`build_model` around it with the config's :attr:`model_config_class` options."""
        if isinstance(model, self.model_class):
            return model
        return self.build_model(model, self.config.group(self.model_config_class))

    def template_settings(self, model: nn.Module) -> dict[str, Any]:
        """The keywords of Avalanche's template that the config sets (its budget), and the optimiser it requires."""
        budget: TrainingOptions = self.config
        # A placeholder, which Avalanche's template requires: make_optimizer builds the real one per experience.
        return dict(optimizer=torch.optim.SGD(model.parameters(), lr=budget.lr), train_mb_size=budget.train_mb_size,
                    train_epochs=budget.train_epochs, eval_mb_size=budget.eval_mb_size, eval_every=budget.eval_every)

    def scans_experiences(self) -> bool:
        """Whether the data checks scan each training experience's samples (the config's ``check_data``)."""
        return self.config.check_data

    def own_plugins(self) -> list[BasePlugin]:
        """Plugins the strategy itself needs, after the data checks and before the user's."""
        return []

    def prepare_experience(self, **kwargs: Any) -> None:
        """After the model added an experience's expert, before its optimiser exists (InfLoRA designs ``A_t``)."""

    def make_optimizer(self, **kwargs: Any) -> None:
        """A fresh optimiser over what trains in this experience."""
        raise NotImplementedError

    # ------------------------------------------------------------------ train and eval: the loader options

    def train(self, experiences: Any, eval_streams: Optional[Sequence[Any]] = None, **kwargs: Any) -> Any:
        """Avalanche's ``train``; the config's loader options (``num_workers``, ...) apply unless given here."""
        return super().train(experiences, eval_streams, **self._with_loader_options(kwargs))

    def eval(self, exp_list: Any, **kwargs: Any) -> Any:
        """Avalanche's ``eval``; the config's loader options (``num_workers``, ...) apply unless given here."""
        return super().eval(exp_list, **self._with_loader_options(kwargs))

    def _with_loader_options(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        # Avalanche hands these keywords to its loaders and to every plugin callback (prototype
        # fitting, the data scan), so one value reaches every loader of the call.
        return {**kwargs, **loader_options(kwargs, self.loader_defaults).loader_options()}

    # ------------------------------------------------------------------ one epoch, one step

    def autocast(self) -> AbstractContextManager:
        """The context of this strategy's forwards and losses (nothing under ``"32-true"``)."""
        return self.precision.autocast(self.device)

    def training_epoch(self, **kwargs: Any) -> None:
        """Avalanche's training epoch (``SGDUpdate.training_epoch``: the same callbacks in the same
        order), the forward and the loss under :meth:`autocast`."""
        self.precision.start_epoch(self.optimizer, self.device, type(self).__name__)
        for self.mbatch in self.dataloader:
            if self._stop_training:
                break
            self._unpack_minibatch()
            self._before_training_iteration(**kwargs)
            self.optimizer.zero_grad()
            self.loss = self._make_empty_loss()
            with self.autocast():
                self._before_forward(**kwargs)
                self.mb_output = self.forward()
                self._after_forward(**kwargs)
                self.loss += self.criterion()
            self._before_backward(**kwargs)
            self.backward()
            self._after_backward(**kwargs)
            self._before_update(**kwargs)
            self.optimizer_step()
            self._after_update(**kwargs)
            self._after_training_iteration(**kwargs)

    def eval_epoch(self, **kwargs: Any) -> None:
        """Avalanche's evaluation epoch, the forward and the loss under :meth:`autocast`."""
        with self.autocast():
            return super().eval_epoch(**kwargs)

    def backward(self) -> None:
        """The backward of the loss (scaled under ``"16-mixed"``)."""
        self.precision.scale(self.loss).backward(retain_graph=self.retain_graph)

    def optimizer_step(self) -> None:
        """The optimiser's step (under ``"16-mixed"`` the scaler's: skipped when a gradient is inf or NaN),
        then the schedule's."""
        self.precision.step(self.optimizer)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()

    # ------------------------------------------------------------------ the learning-rate schedule

    def restart_cosine(self) -> None:
        """Call once the optimiser for the experience exists: the learning rate then anneals to zero over
        the experience's steps (``train_epochs`` x batches), stepping after every optimiser step. For a chunk
        of an online stream with task boundaries, that is over all chunks of its experience (as many as the
        first's)."""
        self.lr_scheduler = CosineAnnealingLR(self.optimizer, T_max=self._experience_steps())

    def restart_epoch_cosine(self) -> None:
        """The ``CosineSchedule`` of InfLoRA's and LoRA subtraction's code (``utils/schedulers.py``), stepped
        once per epoch, as it runs: its constructor sets epoch 0's factor and then ``last_epoch = -1``, so
        the first ``step()``, after epoch 0, sets epoch 0's factor again. Epochs 0 and 1 of E run at lr,
        epoch e >= 1 at ``lr cos(99 pi (e - 1) / (200 (E - 1)))``: the last at 9.7% of lr for E = 20 (the
        formula's 1.6% is never reached). One epoch: lr throughout."""
        self.restart_epoch_cosine_over(self.train_epochs)

    def restart_epoch_cosine_over(self, length: int) -> None:
        """:meth:`restart_epoch_cosine` with the cosine's E = ``length``, while the experience runs
        ``train_epochs`` epochs (the code's ``CosineSchedule(K)`` with K other than the epochs run)."""

        def factor(epoch: int) -> float:
            late = max(epoch - 1, 0)  # the epoch whose factor the code's scheduler has set
            return math.cos(99 * math.pi * late / (200 * (length - 1))) if length > 1 else 1.0

        self._restart_per_epoch(factor)

    def restart_cosine_per_epoch(self) -> None:
        """torch's ``CosineAnnealingLR(T_max=epochs)`` (``eta_min`` 0) stepped once after each epoch, as
        S-Prompts' code (``methods/sprompt.py``, ``train_function``) runs it: epoch e of E runs at
        ``lr (1 + cos(pi e / E)) / 2``, the first at lr, the last at ``lr (1 + cos(pi (E - 1) / E)) / 2``
        (9.5% of lr for E = 5, 2.4% for E = 10: zero is never reached). One epoch: lr throughout."""
        epochs = self.train_epochs
        self._restart_per_epoch(lambda epoch: (1 + math.cos(math.pi * epoch / epochs)) / 2)

    def _restart_per_epoch(self, factor: Callable[[int], float]) -> None:
        """A schedule stepped per optimiser step that holds ``factor(epoch)`` through each of the experience's
        ``train_epochs`` epochs (a schedule the authors' code steps once per epoch)."""
        epochs = self.train_epochs
        per_epoch = max(self._experience_steps() // max(epochs, 1), 1)
        self.lr_scheduler = LambdaLR(self.optimizer, lambda step: factor(min(step // per_epoch, epochs - 1)))

    def _experience_steps(self) -> int:
        steps = self.train_epochs * max(len(self.dataloader), 1)
        experience = self.experience
        if origin_experience(experience) is not experience:
            steps *= experience.sub_stream_length or 1
        return steps

    # ------------------------------------------------------------------ evaluation under torchrun

    def make_eval_dataloader(self, **kwargs: Any) -> None:
        # Under torchrun each rank evaluates its own unpadded shard: Avalanche's distributed sampler pads
        # the last batch, which would count samples twice.
        if is_distributed():
            self.dataloader = eval_loader(self.adapted_dataset, self.eval_mb_size, loader_options(kwargs),
                                          self.device)
            # Every rank's row count of each batch, known alike on every rank: the gathers read none of them.
            self._eval_row_counts = iter(eval_row_counts(len(self.adapted_dataset), self.eval_mb_size,
                                                         DistributedHelper.world_size))
        else:
            super().make_eval_dataloader(**kwargs)

    def _after_eval_forward(self, **kwargs: Any) -> None:
        # First of all plugins: metrics then see the batches of all ranks.
        gather_eval_batch(self, next(self._eval_row_counts, None))
        super()._after_eval_forward(**kwargs)

    # ------------------------------------------------------------------ per experience, per step

    def check_model_and_optimizer(self, **kwargs: Any) -> None:
        # What trains (a new expert, a grown head) exists only after the model adaptation, so the
        # optimiser is built after it, once per experience; the chunks of an online stream's
        # experience (with task boundaries) continue its model, optimiser and schedule.
        # Every model_class counts its experts (num_experts; L2P's, sharing one pool, has none; a baseline
        # writes its own loop): one restored from a checkpoint has its experience's expert already, which is not
        # prepared again.
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


# ---------------------------------------------------------------------- plugins a strategy refuses

# Avalanche plugins that cannot act on these strategies, refused when the strategy is built. CoLoR and
# S-Prompts train a new expert per experience on that experience's own data and never change an earlier
# expert; L2P trains a shared prompt pool and a head that grows with the classes, masking the classes
# outside the current experience; SD-LoRA and InfLoRA add a LoRA component per experience to one ViT and
# train on the current experience's logits only. Plugins that replay old data, distil from or regularise
# towards the previous model, or drive an optimiser the strategy does not use would fail mid-run or be
# silently ignored, so they are refused up front with the reason. Every other plugin (metrics, loggers,
# early stopping, checkpointing, your own) is passed through.
_REPLAY = ("ReplayPlugin", "GDumbPlugin", "GSS_greedyPlugin", "MIRPlugin", "RARPlugin", "BiCPlugin",
           "GenerativeReplayPlugin", "AGEMPlugin", "GEMPlugin", "CoPEPlugin")
_DISTILLATION = ("LwFPlugin", "LFLPlugin", "FeatureDistillationPlugin")
_REGULARISATION = ("EWCPlugin", "SynapticIntelligencePlugin", "MASPlugin", "RWalkPlugin", "CWRStarPlugin")
_SCHEDULE = ("LRSchedulerPlugin",)
_FRESH_MODEL = ("FromScratchTrainingPlugin",)


def incompatible_plugin_reasons(replay: str, distillation: str, regularisation: str, schedule: str,
                                fresh_model: str) -> dict[str, str]:
    """A strategy's :attr:`~StrategyBase.incompatible_plugins`: each kind of Avalanche plugin it refuses,
    by class name, with the reason."""
    table: dict[str, str] = {}
    for names, reason in ((_REPLAY, replay), (_DISTILLATION, distillation), (_REGULARISATION, regularisation),
                          (_SCHEDULE, schedule), (_FRESH_MODEL, fresh_model)):
        table.update(dict.fromkeys(names, reason))
    return table


def refuse_incompatible_plugins(strategy: str, given: Iterable[Any], reasons: dict[str, str]) -> None:
    """Raise a ``ValueError`` naming the first plugin in ``given`` that ``reasons`` refuses, and why."""
    for plugin in given:
        for cls in type(plugin).__mro__:
            if cls.__name__ in reasons and getattr(avalanche_plugins, cls.__name__, None) is cls:
                raise ValueError(
                    f"{strategy} cannot use {type(plugin).__name__}: {reasons[cls.__name__]}. "
                    f"Remove it from plugins=[...]"
                )


# ---------------------------------------------------------------------- routed experts (CoLoR, S-Prompts)

ROUTED_EXPERTS = incompatible_plugin_reasons(
    replay="each expert trains on its own experience only and earlier experts are frozen, so replayed or "
           "stored samples of earlier experiences have nothing to protect, and their classes lie outside the "
           "current expert's head",
    distillation="earlier experts never change and each new expert starts from the frozen backbone, so there "
                 "is no drifting model to distil into",
    regularisation="the weights it would keep close to their old values (earlier experts) are frozen, and the "
                   "current expert's weights are new in every experience",
    schedule="the strategy builds a fresh SGD over each new expert, with its own cosine schedule per experience "
             "(the paper's); a scheduler bound to another optimiser would be silently ignored. To change the "
             "schedule, subclass the strategy and override make_optimizer",
    fresh_model="the strategy keeps its earlier experts by design; resetting the model would discard them",
)


class RoutedExpertsTemplate(StrategyBase):
    """A :class:`~avalanche_color.RoutedExpertViT` trained expert by expert, with prototype routing: the
    training shared by the routed-expert strategies (CoLoR, S-Prompts).

    One expert per training experience, trained alone with SGD and a cosine schedule that restarts per
    experience; after each experience, k-means prototypes for the router
    (:class:`~avalanche_color.PrototypeRouterPlugin`). The strategies differ only in the model they build:
    subclasses name their model and config class and write their ``__init__`` (see :class:`StrategyBase`).
    """

    model: RoutedExpertViT
    config: RoutedExpertsConfig
    incompatible_plugins = ROUTED_EXPERTS
    # The experts that computed the batch's rows in evaluation (all ranks' under torchrun); None in training.
    mb_routed_experts: Optional[Tensor] = None
    optimizer_description = "SGD over the new expert, cosine-annealed over the experience"
    optimizer_options = ("lr", "momentum", "weight_decay")

    def own_plugins(self) -> list[BasePlugin]:
        return [PrototypeRouterPlugin(self.config.group(PrototypeOptions))]

    def forward(self) -> Tensor:
        """The model's forward (through DDP in training under torchrun): in training the expert that
        trains predicts, in evaluation each sample's routed expert, returned beside the logits and kept as
        :attr:`mb_routed_experts`, as Avalanche keeps the logits as ``mb_output``."""
        return routed_forward(self, self.step_model())

    def make_optimizer(self, **kwargs: Any) -> None:
        """A fresh SGD over the expert that trains only, with its schedule (:meth:`restart_schedule`)."""
        trainable = self.model.bank.trainable
        if trainable is None:
            raise RuntimeError("make_optimizer needs an expert that trains: the model adaptation adds one per experience")
        parameters = list(self.model.expert_parameters(trainable))
        config = self.config
        self.optimizer = SGD(parameters, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
        self.restart_schedule()

    def restart_schedule(self) -> None:
        """The schedule of the optimiser just made: cosine over the experience's steps."""
        self.restart_cosine()


# ---------------------------------------------------------------------- the numeric precision

AUTOCAST_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
# Trained in these dtypes, SGD updates below the weight's resolution are lost.
NARROW_DTYPES = (torch.bfloat16, torch.float16)


class MixedPrecision:
    """The ``precision=`` option of a strategy (Lightning's names), held as ``strategy.precision``.

    * ``"32-true"``: float32 throughout (the default; Avalanche's own loop, unchanged).
    * ``"bf16-mixed"``: each forward and its loss, in training and in evaluation, run under
      ``torch.autocast(device, bfloat16)`` (:meth:`autocast`). The weights stay as they are: the trained
      ones (experts, heads, prompts, magnitudes) float32, so an SGD update smaller than bfloat16's
      resolution (2⁻⁸ of the weight) still changes them; the backward computes each gradient in the dtype
      of its forward and accumulates it into the float32 ``.grad``. The routers, k-means and the
      closed-form solvers switch autocast off for themselves
      (:func:`~avalanche_color.routing.classifiers.full_precision`).
    * ``"16-mixed"``: the same with float16, whose narrow range makes small gradients underflow: a
      ``torch.amp.GradScaler`` (:attr:`scaler`) multiplies the loss before the backward (:meth:`scale`)
      and divides the gradients before the step (:meth:`step`, which it skips, lowering the scale, when a
      gradient is inf or NaN).

    Casting the ViT itself (``vit.to(torch.bfloat16)``) halves the frozen backbone's memory; the trained
    weights must not follow it, or most SGD updates vanish (kept in bfloat16, one step at lr 1e-3 changes
    no LoRA entry). Every strategy of the package keeps its trained weights (experts, components, adapters,
    magnitudes, prompts, keys, heads, prototypes) float32 beside such a backbone
    (:func:`~avalanche_color.lora.trained_dtype`): each kernel casts the factors to the tokens' dtype, as autocast
    casts a linear layer's weight, so the model runs with or without autocast. Under ``"32-true"`` the
    backbone then computes in bfloat16 as given and the heads and the loss in float32; ``"bf16-mixed"`` adds
    autocast's float32 for the ops it keeps in float32 (on CUDA: norms, softmax, the loss). The strategies
    warn when they are about to train weights narrower than float32 (a weight a subclass adds in bfloat16).
    """

    def __init__(self, precision: str = "32-true") -> None:
        require("precision", precision, one_of(PRECISIONS))
        self.name = precision
        # Under "16-mixed", made on the first training epoch, on the strategy's device.
        self.scaler: Optional[torch.amp.GradScaler] = None
        self._narrow_warned = False

    def autocast(self, device: torch.device | str) -> AbstractContextManager:
        """The context a forward and its loss run in on ``device`` (nothing under ``"32-true"``)."""
        if self.name == "32-true":
            return nullcontext()
        return torch.autocast(torch.device(device).type, dtype=AUTOCAST_DTYPES[self.name])

    def start_epoch(self, optimizer: torch.optim.Optimizer, device: torch.device | str, strategy: str) -> None:
        """Before a training epoch: warn once if ``optimizer`` trains weights narrower than float32, and
        under ``"16-mixed"`` make the gradient scaler (once)."""
        self._warn_narrow_weights(optimizer, strategy)
        if self.name == "16-mixed" and self.scaler is None:
            self.scaler = torch.amp.GradScaler(torch.device(device).type)

    def scale(self, loss: Tensor) -> Tensor:
        """The loss the backward starts from: ``loss`` multiplied by the scale under ``"16-mixed"``."""
        return loss if self.scaler is None else self.scaler.scale(loss)

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Under ``"16-mixed"``, divide the gradients by the scale now (before clipping them); else nothing."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimiser's step (under ``"16-mixed"`` the scaler's: skipped when a gradient is inf or NaN)."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()

    def _warn_narrow_weights(self, optimizer: torch.optim.Optimizer, strategy: str) -> None:
        if self._narrow_warned:
            return
        narrow = narrow_parameters(p for group in optimizer.param_groups for p in group["params"])
        if narrow:
            self._narrow_warned = True
            dtypes = ", ".join(str(dtype).removeprefix("torch.") for dtype in narrow)
            warnings.warn(
                f"{strategy} trains weights in {dtypes}: SGD updates smaller than that dtype's "
                f"resolution are lost, so most weights stop changing. Make the trained weights float32 "
                f"(avalanche_color.lora.trained_dtype) and use precision='bf16-mixed' for a bfloat16 "
                f"forward, as the package's strategies do (their trained weights stay float32 beside a bfloat16 "
                f"ViT too)", UserWarning, stacklevel=3)


def routed_forward(strategy: Any, model: nn.Module) -> Tensor:
    """A routed expert model's forward for ``strategy``'s batch, as Avalanche's (task labels only where the
    experience has them): in evaluation its routed experts are set as ``strategy.mb_routed_experts``, beside
    the logits Avalanche keeps as ``mb_output``; None in training."""
    task_labels = strategy.mb_task_id if hasattr(strategy.experience, "task_labels") else None
    if strategy.is_training:
        strategy.mb_routed_experts = None
        return model(strategy.mb_x, task_labels)
    logits, strategy.mb_routed_experts = model(strategy.mb_x, task_labels, return_experts=True)
    return logits


def narrow_parameters(parameters: Any) -> dict[torch.dtype, int]:
    """How many of ``parameters`` (that require gradients) are in each dtype narrower than float32."""
    counts: dict[torch.dtype, int] = {}
    for parameter in parameters:
        if parameter.requires_grad and parameter.dtype in NARROW_DTYPES:
            counts[parameter.dtype] = counts.get(parameter.dtype, 0) + 1
    return counts


# ---------------------------------------------------------------------- a strategy's keywords, checked
# How a strategy's keywords become the options its config is built from (StrategyBase.checked_options): each
# function checks or replaces one thing, before anything is copied or adapted.

_UNSET = object()


def plugin_list(value: object) -> Optional[str]:
    """The check of a strategy's ``plugins``: a lone plugin given without a list would otherwise fail later,
    far from the call."""
    return None if value is None or isinstance(value, Sequence) else "must be a sequence of Avalanche plugins or None"


def refuse_optimizer(strategy: type[StrategyBase], options: Mapping[str, Any],
                     template_options: Mapping[str, Any]) -> None:
    """``Naive(model, optimizer=...)`` is Avalanche's habit; here the optimiser is made per experience.

    Refused: an ``optimizer=`` given to a method that has no such option, and a torch optimiser given to
    one whose ``optimizer`` option names its choice (``"sgd"``, ``"adam"``)."""
    given = template_options.get("optimizer", options.get("optimizer", _UNSET))
    if "optimizer" not in template_options and not isinstance(given, torch.optim.Optimizer):
        return
    name = strategy.__name__
    advice = (f"set {', '.join(strategy.optimizer_options)} instead, or subclass {name} and override make_optimizer"
              if strategy.optimizer_options else "nothing of it trains by gradient")
    raise TypeError(
        f"{name} builds its own optimiser per experience ({strategy.optimizer_description}), so it takes no "
        f"optimiser object as optimizer=, got {type(given).__name__}; {advice}"
    )


def refuse_unknown_keywords(strategy: type, config_class: type[Options], template_options: Mapping[str, Any],
                            template: type = SupervisedTemplate) -> None:
    """A keyword that is neither one of ``config_class``'s options nor one of Avalanche's ``template`` (the strategy's
    Avalanche class: ``SupervisedTemplate``, ``JointTraining``) is refused by name, listing the options."""
    accepted: set[str] = set()
    for cls in template.__mro__:  # Avalanche's keywords (peval_mode, ...)
        parameters = inspect.signature(inspect.unwrap(cls.__init__)).parameters.values()
        accepted.update(p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    unknown = sorted(set(template_options) - accepted)
    if unknown:
        raise TypeError(
            f"{strategy.__name__} got unexpected keyword arguments {unknown}; its options are "
            f"{', '.join(config_class.names())} (see {config_class.__name__}), and Avalanche's "
            f"{template.__name__} keywords"
        )


def ready_model_options(strategy: type[StrategyBase], model: nn.Module, config: Optional[Options],
                        given: Mapping[str, Any]) -> dict[str, Any]:
    """A ready ``model_class`` instance's own settings (``strategy.model_settings()``), which its config takes;
    empty for a plain ViT, and for a baseline (which names no model class). One given, or set in ``config``, to
    another value is refused."""
    model_class = getattr(strategy, "model_class", None)
    if model_class is None or not isinstance(model, model_class):
        return {}
    own = {name: getattr(model.config, name) for name in strategy.model_settings()}
    conflicting = sorted(name for name in own if name in given and given[name] != own[name])
    if isinstance(config, strategy.config_class):
        conflicting += sorted(name for name in own if name not in conflicting and getattr(config, name) != own[name])
    if conflicting:
        raise ValueError(
            f"model is already a configured {model_class.__name__} with its own settings; leave "
            f"{conflicting} unset (the model's: {', '.join(f'{name}={own[name]!r}' for name in conflicting)})"
        )
    return own
