"""LoRA subtraction side by side with its authors' code on the same weights and batches
(``python -m benchmarks.investigations.side_by_side.lora_sub --authors-code PATH``): how their code is driven
and what is compared, in :mod:`benchmarks.investigations.side_by_side.lora_sub.__main__`."""
