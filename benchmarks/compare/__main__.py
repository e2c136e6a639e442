"""``python -m benchmarks.compare``: the comparison runner's command line (see :mod:`benchmarks.compare.runner`)."""

from benchmarks.compare.runner import main

main()
