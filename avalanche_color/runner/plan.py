"""Which runs a comparison makes: every (method, variant, seed), and what runs under torchrun."""

from __future__ import annotations

from typing import NamedTuple, Optional

from avalanche_color.benchmarks.registry import BenchmarkSpec
from avalanche_color.runner.config import RunConfig, RunConfigError
from avalanche_color.runner.methods import REGISTRY, method


class PlannedRun(NamedTuple):
    """One run: the method, its label in the tables, the seed, and its rank and k (None where it takes none)."""

    method: str
    label: str
    seed: int
    rank: Optional[int]
    k: Optional[int]


def check_distributed(config: RunConfig) -> None:
    """Refuses what does not run on several processes."""
    allowed = [name for name, entry in REGISTRY.items() if entry.distributed]
    unsupported = [name for name in config.methods if not method(name).distributed]
    if unsupported:
        raise RunConfigError("methods", config.methods, f"cannot hold {unsupported} under torchrun: with several "
                                                        f"processes they must be among {allowed}")
    if config.tune is not None:
        raise RunConfigError("tune", config.tune, "is not supported under torchrun: run the tuned comparison in one "
                                                  "process")
    if config.resume:
        raise RunConfigError("resume", True, "is not supported under torchrun: run the interrupted comparison in "
                                             "one process")


def plan_runs(config: RunConfig, spec: BenchmarkSpec) -> list[PlannedRun]:
    """Every run, in order: per method, each rank (methods with LoRA) x each k (prototype-routed
    methods) x each seed (``seeds`` for the frozen-backbone methods, else ``baseline_seeds``).
    A label names the variant where the method's ranks or ks are ablated."""
    ks = config.ks or (spec.k,)
    plan = []
    for name in config.methods:
        entry = method(name)
        ranks = config.ranks if entry.lora else (None,)
        method_ks = ks if entry.prototypes else (None,)
        ablating = len(ranks) > 1 or len(method_ks) > 1
        seeds = config.seeds if entry.frozen_backbone else config.baseline_seeds or config.seeds[:1]
        for rank in ranks:
            for k in method_ks:
                variant = [f"{axis}={value}" for axis, value in (("r", rank), ("k", k)) if ablating and value]
                label = " ".join([name, *variant])
                plan += [PlannedRun(name, label, seed, rank, k) for seed in seeds]
    return plan
