"""The comparison runner: several methods on one benchmark, same backbone, seeds, epochs and batch.

config.py (what a comparison runs), plan.py (its runs), methods.py (the compared methods),
run.py (one run), loggers.py, results.py (the files written), runner.py (all of it in order),
__main__.py (the command line).
"""

from benchmarks.compare.config import ComparisonConfig
from benchmarks.compare.runner import run_comparison

__all__ = ["ComparisonConfig", "run_comparison"]
