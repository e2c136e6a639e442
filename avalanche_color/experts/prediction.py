"""Prediction with given experts: a batch sorted by expert, each expert's head on its run of samples."""

from __future__ import annotations

from typing import Callable, Optional, Union

import torch
from torch import Tensor, nn

from avalanche_color.lora.segments import ExpertSelection, Segments

# features(x, experts, trained) -> (batch, num_features): a routed model's backbone pass with experts.
Features = Callable[[Tensor, ExpertSelection, Optional[int]], Tensor]


def check_experts(experts: Union[int, Tensor], batch_size: int, num_experts: int,
                  device: torch.device) -> Union[int, Tensor]:
    """Refuse ``experts`` that are not one index or one per sample of the model's ``num_experts``."""
    allowed = f"an index in [0, {num_experts}) or a ({batch_size},) integer tensor of them"
    if isinstance(experts, Tensor):
        if experts.shape != (batch_size,) or experts.is_floating_point() or experts.is_complex():
            raise ValueError(f"experts must be {allowed}, got a {experts.dtype} tensor of shape "
                             f"{tuple(experts.shape)}")
        if batch_size and not (0 <= int(experts.min()) and int(experts.max()) < num_experts):
            raise ValueError(f"experts must be {allowed}, got indices {sorted(set(experts.tolist()))}")
        return experts.to(device, torch.long)
    if isinstance(experts, bool) or not isinstance(experts, int) or not 0 <= experts < num_experts:
        raise ValueError(f"experts must be {allowed}, got {experts!r}")
    return experts


def predict(features: Features, heads: nn.ModuleList, num_classes: int, x: Tensor,
            experts: Union[int, Tensor], trained: Optional[int]) -> Tensor:
    """Global-class logits of ``experts`` (one index for the batch, or one per sample) on ``x``: each
    expert's head on its classes, -inf elsewhere.

    A mixed batch is sorted by expert, so that each expert acts on a contiguous run of
    samples, and put back in order at the end. ``trained``: the expert that trains (see ``features``).
    """
    if isinstance(experts, Tensor) and experts.numel() and bool((experts == experts[0]).all()):
        experts = int(experts[0])  # one expert: no sorting needed
    segments: Segments
    if isinstance(experts, int):
        order, segments = None, [(experts, slice(None))]
        pooled = features(x, experts, trained)
    else:
        order = experts.argsort(stable=True)
        # The runs of equal experts in the sorted batch, as (expert, slice of samples) pairs.
        ids, counts = torch.unique_consecutive(experts[order], return_counts=True)
        bounds = [0, *counts.cumsum(0).tolist()]
        segments = [(int(e), slice(a, b)) for e, a, b in zip(ids.tolist(), bounds, bounds[1:])]
        pooled = features(x[order], segments, trained)
    logits = pooled.new_full((pooled.shape[0], num_classes), float("-inf"))
    for expert, run in segments:
        head = heads[expert]
        logits[run, head.classes] = head(pooled[run]).to(logits.dtype)  # under autocast the head may differ
    if order is None:
        return logits
    unsorted = torch.empty_like(logits)
    unsorted[order] = logits
    return unsorted
