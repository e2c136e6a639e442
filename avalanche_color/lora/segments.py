"""A mixed batch sorted by expert: one contiguous run of samples per expert.

Routing sends each sample of a batch to its own expert. Sorting the batch by
expert turns that into a few contiguous runs, so every layer computes one
expert per run on a slice of the batch (no gather or scatter per layer).
"""

from __future__ import annotations

from typing import Optional, Union

from torch import Tensor

# (expert, run of samples) pairs covering a batch sorted by expert, in batch order.
Segments = list[tuple[int, slice]]
# What a forward computes with: None (the bare backbone), one expert, runs of a sorted batch, or a
# (batch,) tensor of one expert per sample in any order (for kernels that gather each sample's expert).
ExpertSelection = Optional[Union[int, Segments, Tensor]]

