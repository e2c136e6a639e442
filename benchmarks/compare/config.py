"""What one comparison runs: the benchmark, methods, seeds, budget, ablations and outputs, checked."""

from __future__ import annotations

from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any, Optional

from avalanche_color.config import (Options, check_bool, check_int, check_non_negative, check_non_negative_int,
                                    check_positive,
                                    check_positive_int, check_str, each, one_of, option, optional, subset_of,
                                    unchecked)
from benchmarks.compare.methods import METHODS, needs_task_labels
from benchmarks.compare.presets import preset_settings
from benchmarks.streams.registry import BENCHMARKS

from benchmarks import REPOSITORY

RESULTS = REPOSITORY / "benchmarks" / "results"  # the committed tables: written only when asked (--publish)
SCRATCH = REPOSITORY / "runs"  # every other run's output (ignored by git)
LOGGERS = ("text", "csv", "tensorboard")
# The images' mean and std: the backbone's own (timm's pretrained_cfg), or ImageNet's, as
# S-Prompts' code normalises (and so the paper's presets, see benchmarks.compare.presets).
NORMALISATIONS = ("backbone", "imagenet")


def methods_allowed(benchmark: str) -> tuple[str, ...]:
    """The methods ``benchmark`` runs: all but oracle routing where no test experience has a
    training experience's task label (CORe50's held-out sessions)."""
    spec = BENCHMARKS[benchmark]
    return tuple(method for method in METHODS if spec.paired_test_stream or not needs_task_labels(method))


def check_path(name: str, value: object) -> None:
    if not isinstance(value, Path):
        raise ValueError(f"{name} must be a path, got {value!r}")


@dataclass(frozen=True)
class ComparisonConfig(Options):
    """One comparison. ``methods``, ``backbone`` and ``ks`` default to the benchmark's (``methods``:
    every method it allows, :func:`methods_allowed`); ``out`` to
    ``runs/<benchmark>`` (a scratch folder git ignores; the committed tables under
    ``benchmarks/results/`` change only when a command names them, see ``--publish``).

    ``backbone`` is what :func:`~benchmarks.backbones.load_backbone` takes (a timm name, a weights
    file, ``random:<timm name>``, ``offline``, ``digits``); ``architecture`` the timm name that
    builds a plain state dict file. ``ridge_width`` is the random features M of RanPAC and of the
    ridge routers (their M³ solve after each experience is most of their cost). ``normalisation``:
    the images' mean and std, the backbone's own or ImageNet's (:data:`NORMALISATIONS`).
    ``weight_decay`` goes to every method's SGD (None: each method's own, see
    :class:`~benchmarks.compare.methods.Hyperparameters`). ``preset`` names the preset the
    settings came from (:mod:`benchmarks.compare.presets`; :meth:`from_preset` applies one);
    ``preset_settings`` records its values. Every field is checked on construction, as the
    strategies' options are (:mod:`avalanche_color.config`). ``workers``: DataLoader worker processes
    of every method (training, prototype fitting, feature passes, evaluation; persistent when > 0).
    """

    benchmark: str = option(MISSING, one_of(sorted(BENCHMARKS)))
    methods: Optional[tuple[str, ...]] = option(None, optional(subset_of(METHODS)))
    seeds: tuple[int, ...] = option((0,), each(check_int))
    baseline_seeds: Optional[tuple[int, ...]] = option(None, optional(each(check_int)))
    epochs: int = option(5, check_positive_int)
    batch_size: int = option(64, check_positive_int)
    backbone: Optional[str] = option(None, optional(check_str))
    architecture: Optional[str] = option(None, optional(check_str))
    data: Optional[Path] = option(None, optional(check_path))
    ranks: tuple[int, ...] = option((8,), each(check_positive_int))
    ks: Optional[tuple[int, ...]] = option(None, optional(each(check_positive_int)))
    color_lr: float = option(0.05, check_positive)
    baseline_lr: float = option(0.01, check_positive)
    weight_decay: Optional[float] = option(None, optional(check_non_negative))
    prototypes_per_class: Optional[int] = option(None, optional(check_positive_int))
    ridge_width: int = option(2048, check_positive_int)
    workers: int = option(0, check_non_negative_int)
    normalisation: str = option("backbone", one_of(NORMALISATIONS))
    train_per_class: Optional[int] = option(None, optional(check_positive_int))
    device: str = option("auto", check_str)
    out: Optional[Path] = option(None, optional(check_path))
    loggers: tuple[str, ...] = option(LOGGERS, subset_of(LOGGERS, allow_empty=True))
    wandb_project: Optional[str] = option(None, optional(check_str))
    wandb_entity: Optional[str] = option(None, optional(check_str))
    resume: bool = option(False, check_bool)
    checkpoint_epochs: Optional[int] = option(None, optional(check_positive_int))
    preset: Optional[str] = option(None, optional(check_str))
    command: str = option("", check_str, compare=False)
    preset_settings: Optional[dict[str, Any]] = option(None, unchecked, init=False, compare=False)

    @classmethod
    def from_preset(cls, preset: Optional[str], **settings: Any) -> "ComparisonConfig":
        """The preset's settings for ``settings["benchmark"]``, with ``settings`` over them."""
        if preset is None:
            return cls(**settings)
        return cls(**{**preset_settings(preset, settings["benchmark"]), **settings, "preset": preset})

    def __post_init__(self) -> None:
        for name in ("data", "out"):  # paths may come as strings (notebooks, JSON configs)
            if isinstance(getattr(self, name), str):
                object.__setattr__(self, name, Path(getattr(self, name)))
        super().__post_init__()

    @property
    def output_folder(self) -> Path:
        """Where the comparison writes: ``out``, or ``runs/<benchmark>``."""
        return self.out or SCRATCH / self.benchmark

    def _check_together(self) -> None:
        if self.methods is None:
            object.__setattr__(self, "methods", methods_allowed(self.benchmark))
        refused = [method for method in self.methods if method not in methods_allowed(self.benchmark)]
        if refused:
            raise ValueError(f"methods {refused} cannot run on benchmark {self.benchmark!r}: its test experiences "
                             "belong to no training experience (core50: one test set of held-out sessions), so "
                             "there is no task label to route by; "
                             f"methods must be among {methods_allowed(self.benchmark)}")
        if self.preset is not None:
            object.__setattr__(self, "preset_settings", preset_settings(self.preset, self.benchmark))
