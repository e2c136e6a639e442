"""Development tools around ``avalanche_color`` that stay in a clone: the committed results
(``results/``), the tools that regenerate and check their tables (``reporting``), how the small
backbones were made (``backbones``) and speed and memory measurements (``perf``). The runner and
its streams install with the package: ``avalanche_color.runner`` (``avalanche-color compare``)
and ``avalanche_color.benchmarks``."""

from pathlib import Path

# The repository's root: results and the README are found from it.
REPOSITORY = Path(__file__).resolve().parent.parent
