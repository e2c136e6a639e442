"""Which runs a comparison makes: every (method, variant, seed), and what runs under torchrun."""

from __future__ import annotations

from benchmarks.compare.config import ComparisonConfig
from benchmarks.compare.methods import COLOR_ROUTING, FROZEN_BACKBONE, LORA_METHODS, PROTOTYPE_ROUTED
from benchmarks.streams.registry import BenchmarkSpec

# The methods that train on several processes: those built on RoutedExpertsTemplate.
DISTRIBUTED_METHODS = (*COLOR_ROUTING, "S-Prompts")


def check_distributed(config: ComparisonConfig) -> None:
    """Refuses what does not run on several processes."""
    unsupported = [method for method in config.methods if method not in DISTRIBUTED_METHODS]
    if unsupported:
        raise ValueError(f"methods {unsupported} do not run under torchrun; "
                         f"with several processes methods must be among {DISTRIBUTED_METHODS}")
    if config.resume:
        raise ValueError("resume is not supported under torchrun: run the interrupted comparison in one process")


def plan_runs(config: ComparisonConfig, spec: BenchmarkSpec) -> list[tuple[str, str, int, int, int]]:
    """(method, label, seed, rank, k) for every run; labels name the variant when ablating."""
    ks = config.ks or (spec.k,)
    ablating = len(config.ranks) > 1 or len(ks) > 1
    plan = []
    for method in config.methods:
        if method in COLOR_ROUTING:
            for rank in config.ranks:
                for k in ks:
                    label = f"{method} r={rank} k={k}" if ablating else method
                    plan += [(method, label, seed, rank, k) for seed in config.seeds]
        elif method in FROZEN_BACKBONE:  # the prompt methods: no rank; only S-Prompts has a k
            method_ks = ks if method in PROTOTYPE_ROUTED else ks[:1]
            for k in method_ks:
                label = f"{method} k={k}" if len(method_ks) > 1 else method
                plan += [(method, label, seed, config.ranks[0], k) for seed in config.seeds]
        else:  # the baselines and upper bounds: for the baseline seeds; Joint-LoRA for every rank
            for rank in config.ranks if method in LORA_METHODS else config.ranks[:1]:
                label = f"{method} r={rank}" if method in LORA_METHODS and len(config.ranks) > 1 else method
                plan += [(method, label, seed, rank, ks[0]) for seed in config.baseline_seeds or config.seeds[:1]]
    return plan
