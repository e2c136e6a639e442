"""Speed and memory of CoLoR and its peers, measured side by side in one process: ``python -m benchmarks.perf``
(the table), ``python -m benchmarks.perf.step`` (R1 alone), ``python -m benchmarks.perf.kernels`` (operators)."""
