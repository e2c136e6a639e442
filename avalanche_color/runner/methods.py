"""The runner's methods by name, in one table: :data:`REGISTRY`.

The command line (``--methods`` and the methods each flag's help names), the plan of runs, the
tests shared by every strategy and the docs' table of methods all read it. A method joins in one
place: an entry in :data:`REGISTRY` below, or, from a user's own code, :func:`register`.

Importing the registry imports no torch: a method names its strategy (``strategy="CoLoR"`` is
``avalanche_color.CoLoR``) and a run imports it when it builds one, so the command line lists the
methods at once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from importlib import import_module
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, cast

from avalanche_color.runner.presets import UNTUNED_LRS

if TYPE_CHECKING:
    from avalanche.training.templates import SupervisedTemplate
    from torch import nn

    from avalanche_color.benchmarks.registry import BenchmarkSpec


class MethodSettings(Protocol):
    """The run's settings a method reads (:class:`~avalanche_color.runner.config.RunConfig` has them;
    named here by what they are, so that the registry, which the run configuration lists, never imports it)."""

    @property
    def preset(self) -> Optional[str]: ...
    @property
    def color_lr(self) -> float: ...
    @property
    def baseline_lr(self) -> float: ...
    @property
    def weight_decay(self) -> Optional[float]: ...
    @property
    def prototypes_per_class(self) -> Optional[int]: ...
    @property
    def ridge_width(self) -> int: ...
    @property
    def precision(self) -> str: ...


@dataclass(frozen=True)
class MethodRun:
    """What a method is built from in one run: the comparison's settings, this run's rank and k
    (None for a method that takes none), the class count, a fresh backbone (``backbone(n)``: a
    pretrained ViT with a new n-class head; ``backbone(0)``: without one), the options every
    strategy gets alike (batch, epochs, device, evaluator) and the training stream's length."""

    config: MethodSettings
    rank: Optional[int]
    k: Optional[int]
    num_classes: int
    backbone: Callable[[int], "nn.Module"]
    strategy_options: dict[str, Any]
    num_experiences: Optional[int] = None  # the training stream's length, where a method schedules by it

    @property
    def weight_decay(self) -> dict[str, float]:
        """``weight_decay`` given to every SGD, or nothing (each method's own)."""
        return {} if self.config.weight_decay is None else {"weight_decay": self.config.weight_decay}

    @property
    def precision(self) -> dict[str, str]:
        """``precision`` given to the package's strategies (``--precision``), or nothing for the default
        ``"32-true"`` (so runs recorded before the option keep their options)."""
        precision = getattr(self.config, "precision", "32-true")
        return {} if precision == "32-true" else {"precision": precision}


@dataclass(frozen=True)
class Method:
    """One method of the runner.

    ``options(run)`` gives the method's own options (what its strategy is built with, and what a W&B
    run records as its config). ``strategy`` names the strategy class: ``"CoLoR"`` is
    ``avalanche_color.CoLoR``, ``"package.module:Class"`` a class of another package; a run builds it as
    ``Class(run.backbone(0), **options, **run.strategy_options)`` unless ``build(run, options)`` is given.
    ``about``: what the method is, in a few words (the docs' table of methods).

    ``lora``: takes a rank (one run per ``--rank``); ``prototypes``: takes k (one run per ``--k``) and
    reports routing accuracy; ``frozen_backbone``: trains a few parameters on the frozen backbone,
    cheap enough for every ``--seeds`` (the others run ``--baseline-seeds``); ``joint``: trained once on
    the whole stream; ``task_labels``: routes by task label (needs experience i to carry label i);
    ``distributed``: runs under torchrun; ``checkpoint``: its strategy saves and resumes with
    :func:`~avalanche_color.train_stream`'s checkpoints (after every experience, ``--checkpoint-epochs``).
    ``lr_chosen_by``: how the method's learning rate was chosen, recorded beside it in every run's record
    (empty: nothing trains by gradient). ``trains_as``: the method whose training this one's is, exactly (the
    CoLoR variants differ from CoLoR only in how they route), so that ``--lr-from`` may carry that method's
    tuned learning rate to it, and a comparison that runs both evaluates it on that method's trained experts
    (:func:`~avalanche_color.runner.comparison.followed_runs`).
    """

    name: str
    options: Callable[[MethodRun], dict[str, Any]]
    strategy: Optional[str] = None
    build: Optional[Callable[[MethodRun, dict[str, Any]], "SupervisedTemplate"]] = None
    about: str = ""
    lora: bool = False
    prototypes: bool = False
    frozen_backbone: bool = False
    joint: bool = False
    task_labels: bool = False
    distributed: bool = False
    checkpoint: bool = False
    lr_chosen_by: str = ""
    trains_as: str = ""

    def __post_init__(self) -> None:
        if self.strategy is None and self.build is None:
            raise ValueError(f"method {self.name!r} needs a strategy (a class name) or a build function")

    def strategy_class(self) -> Optional[type]:
        """The class ``strategy`` names, imported now (None for a method built otherwise)."""
        if self.strategy is None:
            return None
        module, _, name = self.strategy.rpartition(":")
        return getattr(import_module(module or "avalanche_color"), name)

    def build_strategy(self, run: MethodRun, options: Optional[dict[str, Any]] = None) -> "SupervisedTemplate":
        """The method's strategy for ``run``, with ``options`` (default: ``self.options(run)``)."""
        options = self.options(run) if options is None else options
        if self.build is not None:
            return self.build(run, options)
        strategy_class = cast(type, self.strategy_class())  # __post_init__: a strategy where no build
        return strategy_class(run.backbone(0), **options, **run.strategy_options)


# ---------------------------------------------------------------------- CoLoR and its variants
# How the experts route: the paper's prototypes on the backbone's or the first expert's features, the
# task label, or beyond the paper a class-level ridge or Gaussian router. Every variant's experts train
# exactly as CoLoR's. Joint-LoRA: one CoLoR expert trained on the whole stream at once (an upper bound).
# The runner evaluates after every experience on every test experience seen so far: the routed-expert
# methods (these and S-Prompts) keep their routing features and finished experts' outputs between those
# evaluations (cache_evaluation), so each test image passes the backbone and its expert about once, not
# once per later experience (the committed digits matrices are reproduced identically with it).

COLOR_LR_CHOICE = (f"--color-lr (default by the backbone: {UNTUNED_LRS['shipped']['color_lr']} on the package's, "
                   f"{UNTUNED_LRS['pretrained']['color_lr']} on others); --preset paper: the CoLoR paper's")


def _color_options(routing: dict[str, Any]) -> Callable[[MethodRun], dict[str, Any]]:
    def options(run: MethodRun) -> dict[str, Any]:
        ridge = {"router_width": run.config.ridge_width} if routing.get("router") == "ridge" else {}
        return dict(rank=run.rank, lr=run.config.color_lr, **routing, k=run.k,
                    prototypes_per_class=run.config.prototypes_per_class, **ridge, **run.weight_decay,
                    **run.precision, cache_evaluation=True)
    return options


def _color(name: str, about: str, task_labels: bool = False, **routing: Any) -> Method:
    return Method(name, _color_options(routing), "CoLoR", about=about, lora=True, prototypes=True,
                  frozen_backbone=True, task_labels=task_labels, distributed=True, checkpoint=True,
                  lr_chosen_by=COLOR_LR_CHOICE, trains_as="" if name == "CoLoR" else "CoLoR")


def _joint_lora_options(run: MethodRun) -> dict[str, Any]:
    from avalanche_color.color.config import CoLoRConfig  # imports no torch: --help reads these options

    color = CoLoRConfig()  # CoLoR's momentum and weight decay
    return dict(rank=run.rank, lr=run.config.color_lr, momentum=color.momentum,
                weight_decay=run.weight_decay.get("weight_decay", color.weight_decay), **run.precision)


def _build_joint_lora(run: MethodRun, options: dict[str, Any]) -> "SupervisedTemplate":
    from avalanche_color import JointLoRA

    return JointLoRA(run.backbone(0), num_classes=run.num_classes, **options, **run.strategy_options)


COLOR = (
    _color("CoLoR", "an expert per experience, routed by k-means prototypes of the backbone's features",
           routing_features="backbone", router="prototypes"),
    _color("CoLoR++", "CoLoR routed by the first expert's features", routing_features="first_expert",
           router="prototypes"),
    _color("CoLoR-oracle", "CoLoR routed by the task label (the upper bound of routing)", task_labels=True,
           routing_features="backbone", router="oracle"),
    _color("CoLoR-ridge", "CoLoR routed by a ridge over random features, per (expert, class)",
           routing_features="backbone", router="ridge"),
    _color("CoLoR-gaussian", "CoLoR routed by a Gaussian per (expert, class)", routing_features="backbone",
           router="gaussian"),
    _color("CoLoR++-ridge", "CoLoR++'s features, the ridge router", routing_features="first_expert",
           router="ridge"),
    # Beyond the paper, in the experts: a new expert warm-started from the previous one (it trains otherwise than
    # CoLoR's, so no lr is carried from CoLoR), top-2 routing and HRM-PET's re-matching (both train as CoLoR;
    # only evaluation differs).
    replace(_color("CoLoR-warm", "CoLoR, each new expert starting from the previous one (its head too where the "
                   "classes are the same)", routing_features="backbone", router="prototypes", warm_start=True),
            trains_as=""),
    # The two that helped on the ViT-Ti tables together: the class-incremental streams' best router and the
    # domain stream's experts. The router is fitted after an expert trains, so it trains exactly as CoLoR-warm.
    replace(_color("CoLoR-gaussian-warm", "CoLoR-warm's experts routed by a Gaussian per (expert, class)",
                   routing_features="backbone", router="gaussian", warm_start=True),
            trains_as="CoLoR-warm"),
    _color("CoLoR-top2", "CoLoR, the router's two best experts run; the answer of the best confidence times router weight",
           routing_features="backbone", router="prototypes", top_m=2),
    _color("CoLoR-rematch", "CoLoR, the routed expert re-matched from its first prediction over every expert's head "
           "(HRM-PET's hybrid re-matching, its thresholds)", routing_features="backbone", router="prototypes",
           rematching="hybrid"),
    Method("Joint-LoRA", _joint_lora_options, "JointLoRA", _build_joint_lora,
           about="one CoLoR expert trained on the whole stream at once (an upper bound)", lora=True, joint=True,
           lr_chosen_by=COLOR_LR_CHOICE),
)

# ---------------------------------------------------------------------- the prompt-tuning peers
# S-Prompts: one prompt expert per experience, routed by k prototypes as CoLoR, trained with CoLoR's SGD
# and lr, so the two differ only in the expert. L2P: prompts picked from a shared pool, with its paper's
# Adam, lr and prompt sizes.

S_PROMPTS_LENGTH = 10
L2P_OPTIONS = dict(pool_size=10, prompt_length=5, top_n=5, lr=0.03)


def _s_prompts_options(run: MethodRun) -> dict[str, Any]:
    return dict(prompt_length=S_PROMPTS_LENGTH, lr=run.config.color_lr, k=run.k,
                prototypes_per_class=run.config.prototypes_per_class, **run.weight_decay, **run.precision,
                cache_evaluation=True)


PROMPTS = (
    Method("S-Prompts", _s_prompts_options, "SPrompts", about="a prompt expert per experience, routed as CoLoR",
           prototypes=True, frozen_backbone=True, distributed=True, checkpoint=True,
           lr_chosen_by="--color-lr, as CoLoR"),
    Method("L2P", lambda run: dict(L2P_OPTIONS, **run.precision), "L2P",
           about="prompts picked from a shared pool by key", frozen_backbone=True,
           lr_chosen_by="its paper's Adam lr 0.03 (its code also scales it by batch / 256: not done here)"),
)

# ---------------------------------------------------------------------- the LoRA peers
# The LoRA continual learners that came after CoLoR and route nothing. Each adapts one shared sum of LoRA
# components on the frozen ViT, at the runner's --rank (as CoLoR, so the comparison is at equal rank; both
# papers use 10), with one classifier over every class seen. SD-LoRA trains as its code does, at any budget:
# SGD with momentum 0.9 at lr 0.008, constant (exps/sdlora_c100.json; the strategy's defaults). InfLoRA keeps
# its code's Adam and cosine schedule; its code's lr (5e-4 over 20 epochs) underfits the runner's budgets of
# 2 to 5 epochs, so it runs at 5e-3, one value for every benchmark (chosen on the class-incremental digits
# stream, where 5e-4 reached 0.48 and 5e-3 0.74 average accuracy after 2 epochs). Its protected subspace's
# threshold rises from 0.95 to 1.0 over the stream's experiences, as in its code.
# LoRA subtraction keeps its code's projected Adam (lr 5e-4 for the LoRA weights, 2e-3 for its training head)
# and per-epoch cosine, and predicts by the nearest class mean; under --tune lr the LoRA weights' rate is
# tuned, the head's stays its code's. CL-LoRA keeps its code's SGD (lr 0.03, momentum 0.9, weight decay
# 1e-4) with a per-epoch cosine and its two steps per batch; under torchrun each step's gradients are
# averaged over the ranks. With --preset paper each keeps its own code's optimiser settings (the
# strategies' defaults), its weight decay included; the preset's batch, epochs and rank are the budget
# every method gets alike.

INF_LORA_LR = 5e-3


def _short_budget_lr(run: MethodRun, lr: float) -> dict[str, float]:
    """``lr`` for the runner's short budgets; nothing under ``--preset paper`` (the method's own default)."""
    return {} if run.config.preset == "paper" else {"lr": lr}


def _peer_weight_decay(run: MethodRun) -> dict[str, float]:
    """``--weight-decay`` for a LoRA peer; under ``--preset paper`` its own code's, unless the flag gives another
    value than the preset's (the CoLoR paper's 2e-4 is its protocol, not the peers')."""
    preset = getattr(run.config, "preset_settings", None) or {}
    if run.config.preset == "paper" and run.config.weight_decay == preset.get("weight_decay"):
        return {}
    return run.weight_decay


def _lora_options(run: MethodRun) -> dict[str, Any]:
    return dict(rank=run.rank, **_peer_weight_decay(run), **run.precision)


def _inf_lora_options(run: MethodRun) -> dict[str, Any]:
    return dict(rank=run.rank, **_short_budget_lr(run, INF_LORA_LR), num_experiences=run.num_experiences,
                **_peer_weight_decay(run), **run.precision)


LORA_PEER = dict(lora=True, frozen_backbone=True, distributed=True, checkpoint=True)  # what the four share

LORA_PEERS = (
    Method("SD-LoRA", _lora_options, "SDLoRA", about="a LoRA direction per experience; earlier ones frozen, their scales learned", **LORA_PEER,
           lr_chosen_by="its authors' code (SD-Lora-CL exps/sdlora_c100.json: SGD 0.008, constant)"),
    Method("InfLoRA", _inf_lora_options, "InfLoRA",
           about="a sum of LoRA components, each new one outside the earlier experiences' input subspace",
           **LORA_PEER,
           lr_chosen_by="by hand on digits_class at 2 epochs (5e-3; the code's 5e-4 underfits short budgets); "
                        "--preset paper: its code's 5e-4"),
    Method("LoRA-Sub", _lora_options, "LoRASubtraction",
           about="LoRA trained in a subspace from which earlier LoRA weights were subtracted; nearest class mean",
           **LORA_PEER,
           lr_chosen_by="its authors' code (LoRA-Sub-DRS configs/cifar100.json: projected Adam 5e-4, head 2e-3)"),
    Method("CL-LoRA", _lora_options, "CLLoRA",
           about="shared and per-experience LoRA adapters, two steps per batch", **LORA_PEER,
           lr_chosen_by="its authors' code (CL-LoRA exps/cifar.json: SGD 0.03, per-epoch cosine)"),
)

# ---------------------------------------------------------------------- Avalanche's fine-tuning strategies
# On the whole ViT (SGD, --baseline-lr): Naive, the paper's "FT + class masking" (FT-masked), EWC, LwF,
# Replay, and Joint-FT (Avalanche's JointTraining on all experiences at once, an upper bound).

EWC_LAMBDA = 100.0
LWF_ALPHA, LWF_TEMPERATURE = 1.0, 2.0
REPLAY_MEMORY = 200


def _fine_tuning_options(**own: Any) -> Callable[[MethodRun], dict[str, Any]]:
    def options(run: MethodRun) -> dict[str, Any]:
        return dict(lr=run.config.baseline_lr, momentum=0.9, weight_decay=run.config.weight_decay or 0.0, **own)
    return options


def _avalanche_strategy(template: str, masked: bool = False) -> Callable[[MethodRun, dict[str, Any]], Any]:
    def build(run: MethodRun, options: dict[str, Any]) -> "SupervisedTemplate":
        import torch
        from avalanche import training
        from torch import nn

        if masked:
            from avalanche.models import IncrementalClassifier
            from avalanche.models.utils import FeatureExtractorModel

            from avalanche_color import CurrentClassesMasking

            vit = run.backbone(0)
            head = IncrementalClassifier(vit.num_features, run.num_classes, masking=True, mask_value=float("-inf"))
            model: nn.Module = FeatureExtractorModel(vit, head)
            plugins = [CurrentClassesMasking(head)]
        else:
            model, plugins = run.backbone(run.num_classes), []
        sgd = {name: options[name] for name in ("lr", "momentum", "weight_decay")}
        own = {name: value for name, value in options.items() if name not in sgd}
        return getattr(training, template)(model=model, optimizer=torch.optim.SGD(model.parameters(), **sgd),
                                           criterion=nn.CrossEntropyLoss(), plugins=plugins, **own,
                                           **run.strategy_options)
    return build


FINE_TUNING_LR = (f"--baseline-lr (one value for every fine-tuning baseline; default by the backbone: "
                  f"{UNTUNED_LRS['shipped']['baseline_lr']} on the package's, {UNTUNED_LRS['pretrained']['baseline_lr']} "
                  f"on others)")

FINE_TUNING = (
    Method("Naive", _fine_tuning_options(), build=_avalanche_strategy("Naive"),
           about="the whole ViT fine-tuned (Avalanche's Naive)", lr_chosen_by=FINE_TUNING_LR),
    Method("FT-masked", _fine_tuning_options(), build=_avalanche_strategy("Naive", masked=True),
           about="fine-tuning, logits outside the experience's classes masked in training",
           lr_chosen_by=FINE_TUNING_LR),
    Method("EWC", _fine_tuning_options(ewc_lambda=EWC_LAMBDA), build=_avalanche_strategy("EWC"),
           about="Avalanche's EWC", lr_chosen_by=FINE_TUNING_LR),
    Method("LwF", _fine_tuning_options(alpha=LWF_ALPHA, temperature=LWF_TEMPERATURE),
           build=_avalanche_strategy("LwF"), about="Avalanche's LwF", lr_chosen_by=FINE_TUNING_LR),
    Method("Replay", _fine_tuning_options(mem_size=REPLAY_MEMORY), build=_avalanche_strategy("Replay"),
           about=f"Avalanche's Replay, {REPLAY_MEMORY} samples", lr_chosen_by=FINE_TUNING_LR),
    Method("Joint-FT", _fine_tuning_options(), build=_avalanche_strategy("JointTraining"), joint=True,
           about="the whole ViT fine-tuned on the whole stream at once (an upper bound)",
           lr_chosen_by=FINE_TUNING_LR),
)

# ---------------------------------------------------------------------- training-free baselines
# On the frozen backbone: NCM (the nearest class mean of its normalised features, SimpleCIL) and RanPAC (a
# closed-form ridge over random ReLU features, --ridge-width wide).

TRAINING_FREE = (
    Method("NCM", lambda run: {}, "NCM", about="the nearest class mean of the backbone's features; nothing trains"),
    Method("RanPAC", lambda run: dict(width=run.config.ridge_width), "RanPAC",
           about="a closed-form ridge over random ReLU features of the backbone; nothing trains"),
)


# ---------------------------------------------------------------------- the registry

REGISTRY: dict[str, Method] = {}
# The methods' names, in registry order: a live view, so a method registered later is among them.
METHODS = REGISTRY.keys()


def register(*entries: Method) -> None:
    """Adds methods to the registry, after those there: the command line's ``--methods`` and ``--help``,
    the plan of runs and the shared tests take them at once. A name already registered is refused
    (nothing is added then)."""
    names = [entry.name for entry in entries]
    for entry in entries:
        if not isinstance(entry, Method):
            raise TypeError(f"register takes Method entries, got {entry!r}")
    taken = [name for name in names if name in REGISTRY or names.count(name) > 1]
    if taken:
        raise ValueError(f"method {taken[0]!r} is registered already")
    REGISTRY.update((entry.name, entry) for entry in entries)


register(*COLOR, *PROMPTS, *LORA_PEERS, *FINE_TUNING, *TRAINING_FREE)


def method(name: str) -> Method:
    """The method called ``name``."""
    if name not in REGISTRY:
        raise ValueError(f"method must be one of {list(METHODS)}, got {name!r}")
    return REGISTRY[name]


def package_strategies() -> dict[str, type]:
    """The strategy classes the registered methods build, by class name, in registry order (imports them)."""
    classes = (entry.strategy_class() for entry in REGISTRY.values())
    return {cls.__name__: cls for cls in classes if cls is not None}


# The settings of a run that Method's own fields stand for: one run per --rank for a method with ``lora``, ...
_SETTING_FIELDS = {"ranks": "lora", "ks": "prototypes", "seeds": "frozen_backbone", "checkpoint_epochs": "checkpoint"}


class _ReadRecorder:
    """Stands for a run's settings (:class:`MethodSettings`) and notes which ones are read; each reads None."""

    def __init__(self) -> None:
        self.read: set[str] = set()

    def __getattr__(self, name: str) -> Any:  # None, standing for whatever value the setting has
        if name.startswith("__"):
            raise AttributeError(name)
        self.read.add(name)
        return None


def _no_backbone(num_classes: int) -> nn.Module:
    raise RuntimeError("a method's options are built without a backbone")


def settings_read(name: str) -> frozenset[str]:
    """The run's settings (names of :class:`MethodSettings`) that method ``name``'s options read, found by
    building its options once on a stand-in that records what is read (it imports no torch). A decision: a
    ``reads=(...)`` list in each :class:`Method` would say again what its ``options`` already say, and could
    drift from it; ``--help`` and the refusals of a flag a method does not take read this instead."""
    recorder = _ReadRecorder()
    method(name).options(MethodRun(recorder, rank=1, k=1, num_classes=2, backbone=_no_backbone,
                                   strategy_options={}, num_experiences=2))
    return frozenset(recorder.read)


def methods_taking(setting: str) -> tuple[str, ...]:
    """The methods that take the run's ``setting`` (a field of the runner's ``RunConfig``), in registry order:
    for ``ranks``, ``ks``, ``seeds`` and ``checkpoint_epochs`` those whose :class:`Method` says ``lora``,
    ``prototypes``, ``frozen_backbone`` and ``checkpoint``; for ``baseline_seeds`` the methods ``seeds`` leaves;
    for any other, those whose options read it (:func:`settings_read`). So ``--help`` lists them from here."""
    if setting == "baseline_seeds":
        return tuple(name for name in METHODS if name not in methods_taking("seeds"))
    if setting in _SETTING_FIELDS:
        return tuple(name for name, entry in REGISTRY.items() if getattr(entry, _SETTING_FIELDS[setting]))
    return tuple(name for name in METHODS if setting in settings_read(name))


def methods_allowed(spec: "BenchmarkSpec") -> tuple[str, ...]:
    """The methods a benchmark runs: all but task-label routing where no test experience has a
    training experience's task label (CORe50's held-out sessions)."""
    return tuple(name for name, entry in REGISTRY.items() if spec.paired_test_stream or not entry.task_labels)


def build_strategy(run: MethodRun, name: str) -> "SupervisedTemplate":
    """The strategy of method ``name`` for ``run``."""
    return method(name).build_strategy(run)
