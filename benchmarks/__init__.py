"""What a user of a clone runs around ``avalanche_color``: the committed results (``results/``), the
committed results' form as a runner command (``compare``), the tools that regenerate and check their tables
(``reporting``), how the small backbones were made (``pretraining``), speed and memory measurements
(``perf``), the first run on a GPU (``gpu_checklist``) and the offline install (``wheelhouse``). The
evidence behind single paragraphs of the docs lives apart, in ``investigations`` (its README maps each
tool to its paragraph). The runner and its streams install with the package: ``avalanche_color.runner``
(``avalanche-color compare``) and ``avalanche_color.benchmarks``."""

from pathlib import Path

# The repository's root: results and the README are found from it.
REPOSITORY = Path(__file__).resolve().parent.parent
