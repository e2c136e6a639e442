"""CL-LoRA side by side with its authors' code on the same weights and batches
(``python -m benchmarks.investigations.side_by_side.cl_lora --authors-code PATH``): how their code is driven and what is
compared, in :mod:`benchmarks.investigations.side_by_side.cl_lora.__main__`."""
