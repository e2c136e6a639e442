"""``python -m benchmarks.compare ...``: the command as the committed results record it
(``benchmarks/results/*/results.json``), kept so that each runs as written. It is
``avalanche-color compare ...`` with ``--publish`` for ``--out-dir benchmarks/results``."""

from __future__ import annotations

import os
import sys
from typing import Any, Optional, Sequence

from avalanche_color.runner import cli
from benchmarks import REPOSITORY

PUBLISH = "--publish"  # write under benchmarks/results/, the committed tables


def translated(argv: Sequence[str]) -> list[str]:
    """``avalanche-color``'s arguments for ``argv``."""
    published = ["--out-dir", os.path.relpath(REPOSITORY / "benchmarks" / "results")] if PUBLISH in argv else []
    return ["compare", *(word for word in argv if word != PUBLISH), *published]


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(f"python -m benchmarks.compare: avalanche-color compare with {PUBLISH} for --out-dir benchmarks/results "
              "(the form the committed results record)\n")
    return cli.main(translated(argv))


if __name__ == "__main__":
    main()
