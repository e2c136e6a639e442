"""Interleaved timing: every round runs every variant once, in a rotating order; and the machine it ran on.

Ratios are computed within a round, from that round's timings, so that a slow
spell of the machine (another process, frequency scaling, a cold cache) moves
numerator and denominator together; the spread over rounds says how much the
figure can be trusted.
"""

from __future__ import annotations

import platform
import statistics
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch


def machine(device: torch.device) -> str:
    """The device in words, as each section of the report names it: the GPU, or the CPU and its threads."""
    return (torch.cuda.get_device_name(device) if device.type == "cuda"
            else f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads")


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that a timer read after it covers that work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Variant:
    """One timed call. ``setup`` runs before the timer starts (e.g. model.train()).

    ``autocast``: whether the run's precision context (bf16 autocast with
    ``--bf16``) applies; off for work that is not the model's (k-means) and for
    strategies, which apply their own ``precision``.
    ``clock``: the seconds the run measured of itself, read after it (a
    :class:`~benchmarks.perf.strategies.Clock`'s timing of the strategy's
    iteration inside its ``train`` or ``eval`` call); None: the call's wall time.
    """

    run: Callable[[], object]
    setup: Optional[Callable[[], object]] = None
    autocast: bool = True
    clock: Optional[Callable[[], float]] = None


@dataclass
class Spread:
    """Values over rounds, reported as median (min-max)."""

    values: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def format(self, digits: int = 3) -> str:
        if len(self.values) == 1:
            return f"{self.values[0]:.{digits}f}"
        low, high = min(self.values), max(self.values)
        separator = "-" if low >= 0 else " to "  # 2.21 (2.15-2.30); -0.10 (-0.20 to 0.05)
        return f"{self.median:.{digits}f} ({low:.{digits}f}{separator}{high:.{digits}f})"


def interleaved(variants: dict[str, Variant], rounds: int, device: torch.device,
                precision: Callable[[], AbstractContextManager] = nullcontext,
                warmup_rounds: int = 1, log: bool = True) -> list[dict[str, float]]:
    """Seconds of each variant in each round: ``result[round][name]``.

    Round ``r`` runs the variants in their given order rotated by ``r`` places, so
    that no variant always runs first or right after the same neighbour. Warm-up
    rounds run the same way and are not returned.
    """
    names = list(variants)
    results = []
    for index in range(-warmup_rounds, rounds):
        shift = index % len(names)
        timings = {}
        for name in names[shift:] + names[:shift]:
            variant = variants[name]
            if variant.setup is not None:
                variant.setup()
            context = precision() if variant.autocast else nullcontext()
            synchronize(device)
            start = time.perf_counter()
            with context:
                variant.run()
            synchronize(device)
            timings[name] = time.perf_counter() - start if variant.clock is None else variant.clock()
        if index >= 0:
            results.append(timings)
        if log:
            label = "warm-up" if index < 0 else f"round {index + 1}/{rounds}"
            print(f"[perf] {label}: {sum(timings.values()):.1f} s", file=sys.stderr, flush=True)
    return results


def per_round(rounds: list[dict[str, float]], ratio: Callable[[dict[str, float]], float]) -> Spread:
    """``ratio`` of each round's timings."""
    return Spread([ratio(timings) for timings in rounds])


def seconds(rounds: list[dict[str, float]], name: str) -> Spread:
    return Spread([timings[name] for timings in rounds])
