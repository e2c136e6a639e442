"""The runner's methods by name: one module per family, each a tuple of :class:`Method` entries.

* ``color``: CoLoR and its routing variants, and Joint-LoRA (one CoLoR expert on the whole stream);
* ``prompts``: the prompt-tuning peers, S-Prompts and L2P;
* ``lora_peers``: the LoRA continual learners that route nothing, SD-LoRA, InfLoRA, LoRA subtraction and
  CL-LoRA;
* ``avalanche_baselines``: Avalanche's fine-tuning strategies (Naive, FT-masked, EWC, LwF, Replay, Joint-FT);
* ``training_free``: NCM and RanPAC on the frozen backbone.

A new family is one module with ``METHODS = (Method(...), ...)`` and its name in
:data:`FAMILIES`. Importing the registry imports no torch: a family's ``build`` imports what
it needs when it is called, so the command line lists the methods at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

if TYPE_CHECKING:
    from avalanche.training.templates import SupervisedTemplate
    from torch import nn

    from avalanche_color.benchmarks.registry import BenchmarkSpec

FAMILIES = ("color", "prompts", "lora_peers", "avalanche_baselines", "training_free")


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

    ``options(run)`` gives the method's own options (what its strategy is built with, and what a
    W&B run records as its config); ``build(run, options)`` the strategy. ``lora``: takes a rank
    (one run per ``--rank``); ``prototypes``: takes k (one run per ``--k``) and reports routing
    accuracy; ``frozen_backbone``: trains a few parameters on the frozen backbone, cheap enough for
    every ``--seeds`` (the others run ``--baseline-seeds``); ``joint``: trained once on the whole
    stream; ``task_labels``: routes by task label (needs experience i to carry label i);
    ``distributed``: runs under torchrun; ``checkpoint``: its strategy saves and resumes with
    :func:`~avalanche_color.train_stream`'s checkpoints (after every experience, ``--checkpoint-epochs``).
    ``lr_chosen_by``: how the method's learning rate was chosen, recorded beside it in every run's record
    (empty: nothing trains by gradient).
    """

    name: str
    options: Callable[[MethodRun], dict[str, Any]]
    build: Callable[[MethodRun, dict[str, Any]], "SupervisedTemplate"]
    lora: bool = False
    prototypes: bool = False
    frozen_backbone: bool = False
    joint: bool = False
    task_labels: bool = False
    distributed: bool = False
    checkpoint: bool = False
    lr_chosen_by: str = ""


def package_strategy(class_name: str) -> Callable[[MethodRun, dict[str, Any]], "SupervisedTemplate"]:
    """The ``build`` of a method that is one of the package's strategies: ``avalanche_color.<class_name>``
    on a fresh backbone without a head, with the method's options and those every strategy gets alike
    (imported when called, so that listing the methods imports no torch)."""

    def build(run: MethodRun, options: dict[str, Any]) -> "SupervisedTemplate":
        strategy_class = getattr(import_module("avalanche_color"), class_name)
        return strategy_class(run.backbone(0), **options, **run.strategy_options)

    build.__qualname__ = f"package_strategy({class_name!r})"
    return build


def _registry() -> dict[str, Method]:
    methods: dict[str, Method] = {}
    for family in FAMILIES:
        for method in import_module(f"{__name__}.{family}").METHODS:
            if method.name in methods:
                raise ValueError(f"method {method.name!r} is declared twice (family {family!r})")
            methods[method.name] = method
    return methods


REGISTRY: dict[str, Method] = _registry()
METHODS: tuple[str, ...] = tuple(REGISTRY)


def method(name: str) -> Method:
    """The method called ``name``."""
    if name not in REGISTRY:
        raise ValueError(f"method must be one of {list(METHODS)}, got {name!r}")
    return REGISTRY[name]


# The settings of a run that Method's own fields stand for: one run per --rank for a method with ``lora``, ...
_SETTING_FIELDS = {"ranks": "lora", "ks": "prototypes", "seeds": "frozen_backbone", "checkpoint_epochs": "checkpoint"}


class _ReadRecorder:
    """Stands for a run's settings (:class:`MethodSettings`) and notes which ones are read; each reads None."""

    def __init__(self) -> None:
        self.read: set[str] = set()

    def __getattr__(self, name: str) -> None:
        if name.startswith("__"):
            raise AttributeError(name)
        self.read.add(name)
        return None


def settings_read(name: str) -> frozenset[str]:
    """The run's settings (names of :class:`MethodSettings`) that method ``name``'s options read, found by
    building its options once on a stand-in that records what is read (it imports no torch)."""
    recorder = _ReadRecorder()
    method(name).options(MethodRun(recorder, rank=1, k=1, num_classes=2, backbone=None,  # type: ignore[arg-type]
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
    entry = method(name)
    return entry.build(run, entry.options(run))
