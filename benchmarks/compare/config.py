"""What one comparison runs: the benchmark, methods, seeds, budget, ablations and outputs, checked."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from benchmarks.compare.methods import METHODS
from benchmarks.compare.presets import preset_settings
from benchmarks.streams.registry import benchmark_spec

RESULTS = Path(__file__).parents[1] / "results"
LOGGERS = ("text", "csv", "tensorboard")


@dataclass(frozen=True)
class ComparisonConfig:
    """One comparison. ``backbone``, ``ks`` and ``out`` default to the benchmark's.

    ``weight_decay`` goes to every method's SGD (None: each method's own, see
    :class:`~benchmarks.compare.methods.Hyperparameters`). ``preset`` names the preset the
    settings came from (:mod:`benchmarks.compare.presets`; :meth:`from_preset` applies one);
    ``preset_settings`` records its values.
    """

    benchmark: str
    methods: tuple[str, ...] = METHODS
    seeds: tuple[int, ...] = (0,)
    baseline_seeds: Optional[tuple[int, ...]] = None
    epochs: int = 5
    batch_size: int = 64
    backbone: Optional[str] = None
    data: Optional[Path] = None
    ranks: tuple[int, ...] = (8,)
    ks: Optional[tuple[int, ...]] = None
    color_lr: float = 0.05
    baseline_lr: float = 0.01
    weight_decay: Optional[float] = None
    prototypes_per_class: Optional[int] = None
    train_per_class: Optional[int] = None
    device: str = "auto"
    out: Optional[Path] = None
    loggers: tuple[str, ...] = LOGGERS
    wandb_project: Optional[str] = None
    wandb_entity: Optional[str] = None
    resume: bool = False
    checkpoint_epochs: Optional[int] = None
    preset: Optional[str] = None
    command: str = field(default="", compare=False)
    preset_settings: Optional[dict[str, Any]] = field(default=None, init=False, compare=False)

    @classmethod
    def from_preset(cls, preset: Optional[str], **settings: Any) -> "ComparisonConfig":
        """The preset's settings for ``settings["benchmark"]``, with ``settings`` over them."""
        if preset is None:
            return cls(**settings)
        return cls(**{**preset_settings(preset, settings["benchmark"]), **settings, "preset": preset})

    def __post_init__(self) -> None:
        benchmark_spec(self.benchmark)
        if self.preset is not None:
            object.__setattr__(self, "preset_settings", preset_settings(self.preset, self.benchmark))
        for name in ("data", "out"):  # paths may come as strings (notebooks, JSON configs)
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))
        for name, values, allowed in (("methods", self.methods, METHODS), ("loggers", self.loggers, LOGGERS)):
            unknown = [v for v in values if v not in allowed]
            if unknown:
                raise ValueError(f"{name} must be among {allowed}, got {unknown}")
        for name in ("seeds", "ranks", "methods"):
            if not getattr(self, name):
                raise ValueError(f"{name} must not be empty")
        if self.checkpoint_epochs is not None and self.checkpoint_epochs < 1:
            raise ValueError(f"checkpoint_epochs must be a positive integer, got {self.checkpoint_epochs}")
        for name, values in (("ranks", self.ranks), ("ks", self.ks or ()),
                             ("epochs", (self.epochs,)), ("batch_size", (self.batch_size,))):
            if any(v < 1 for v in values):
                raise ValueError(f"{name} must be positive integers, got {values}")
        if self.prototypes_per_class is not None and self.prototypes_per_class < 1:
            raise ValueError(f"prototypes_per_class must be a positive integer, got {self.prototypes_per_class}")
        if self.weight_decay is not None and self.weight_decay < 0:
            raise ValueError(f"weight_decay must be non-negative, got {self.weight_decay}")
