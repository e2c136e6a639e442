"""The comparison runner: several methods on one benchmark, same backbone, seeds, epochs and batch."""

from benchmarks.compare.runner import ComparisonConfig, main, run_comparison

__all__ = ["ComparisonConfig", "main", "run_comparison"]
