"""What one comparison runs: the benchmark, methods, seeds, budget, ablations and outputs, checked."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from benchmarks.compare.methods import METHODS
from benchmarks.streams.registry import benchmark_spec

RESULTS = Path(__file__).parents[1] / "results"
LOGGERS = ("text", "csv", "tensorboard")


@dataclass(frozen=True)
class ComparisonConfig:
    """One comparison. ``backbone``, ``ks`` and ``out`` default to the benchmark's."""

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
    train_per_class: Optional[int] = None
    device: str = "auto"
    out: Optional[Path] = None
    loggers: tuple[str, ...] = LOGGERS
    wandb_project: Optional[str] = None
    wandb_entity: Optional[str] = None
    resume: bool = False
    checkpoint_epochs: Optional[int] = None
    command: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        benchmark_spec(self.benchmark)
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
