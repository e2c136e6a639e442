"""LoRA experts on the query and value projections of a fused qkv layer."""
