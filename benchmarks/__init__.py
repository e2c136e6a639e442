"""Streams, backbones, the comparison runner, reporting and timing around ``avalanche_color``."""

from pathlib import Path

# The repository's root: results, caches and the README are found from it.
REPOSITORY = Path(__file__).resolve().parent.parent
