"""``python -m benchmarks.gpu_checklist``: the checklist of :mod:`benchmarks.gpu_checklist`."""

from benchmarks.gpu_checklist import main

main()
