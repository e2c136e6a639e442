"""Prediction with given experts: one expert for the batch, or one per sample by one of two kernels.

A batch that mixes experts is computed either

* ``"segments"``: sorted by expert, so that each expert acts on a contiguous run of samples (a
  few matmuls per expert and layer, the fastest on a CPU); the runs' bounds need one host sync;
* ``"gathered"``: unsorted, each sample's expert factors and head gathered by its index (a fixed
  number of kernels whatever the number of experts, fixed shapes, no host sync: for GPUs).

``"auto"`` takes the gathered kernel on CUDA and the segments elsewhere.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Callable, Literal, Optional, Union, get_args

import torch
from torch import Tensor, nn

from avalanche_color.experts.heads import gathered_head_logits
from avalanche_color.lora.dtypes import trained_dtype
from avalanche_color.lora.segments import ExpertSelection, Segments

# features(x, experts, trained) -> (batch, num_features): a routed model's backbone pass with experts.
Features = Callable[[Tensor, ExpertSelection, Optional[int]], Tensor]
MixedKernel = Literal["auto", "segments", "gathered"]
MIXED_KERNELS: tuple[str, ...] = get_args(MixedKernel)


def check_experts(experts: Union[int, Tensor], batch_size: int, num_experts: int,
                  device: torch.device) -> Union[int, Tensor]:
    """Refuse ``experts`` that are not one index or one per sample of the model's ``num_experts``
    (one host sync for a tensor: its smallest and largest index)."""
    allowed = f"an index in [0, {num_experts}) or a ({batch_size},) integer tensor of them"
    if isinstance(experts, Tensor):
        if experts.shape != (batch_size,) or experts.is_floating_point() or experts.is_complex():
            raise ValueError(f"experts must be {allowed}, got a {experts.dtype} tensor of shape "
                             f"{tuple(experts.shape)}")
        if batch_size:
            low, high = torch.stack((experts.min(), experts.max())).tolist()
            if not (0 <= low and high < num_experts):
                raise ValueError(f"experts must be {allowed}, got indices {sorted(set(experts.tolist()))}")
        return experts.to(device, torch.long)
    if isinstance(experts, bool) or not isinstance(experts, int) or not 0 <= experts < num_experts:
        raise ValueError(f"experts must be {allowed}, got {experts!r}")
    return experts


def check_mixed_kernel(kernel: str) -> None:
    """Refuse a kernel name other than those of :data:`MixedKernel`."""
    if kernel not in MIXED_KERNELS:
        raise ValueError(f"mixed_kernel must be one of {', '.join(map(repr, MIXED_KERNELS))}, got {kernel!r}")


def gathers(kernel: MixedKernel, device: torch.device) -> bool:
    """Whether a mixed batch on ``device`` takes the gathered kernel (``"auto"``: on CUDA)."""
    check_mixed_kernel(kernel)
    return kernel == "gathered" or (kernel == "auto" and device.type == "cuda")


def predict(features: Features, heads: nn.ModuleList, num_classes: int, x: Tensor,
            experts: Union[int, Tensor], trained: Optional[int], kernel: MixedKernel = "segments") -> Tensor:
    """Global-class logits of ``experts`` (one index for the batch, or one per sample) on ``x``: each
    expert's head on its classes, -inf elsewhere.

    ``trained``: the expert that trains (see ``features``). ``kernel``: how a per-sample tensor of
    experts is computed (see the module docstring); ``"gathered"`` needs a ``features`` that takes a
    (batch,) tensor of experts. One index for the batch always takes the single-expert path.
    """
    if isinstance(experts, Tensor) and gathers(kernel, x.device):
        return gathered_head_logits(heads, features(x, experts, trained), experts, num_classes, trained)
    if isinstance(experts, int):
        return _single_expert_logits(features, heads, num_classes, x, experts, trained)
    return _segment_logits(features, heads, num_classes, x, experts, trained)


def _single_expert_logits(features: Features, heads: nn.ModuleList, num_classes: int, x: Tensor, expert: int,
                          trained: Optional[int]) -> Tensor:
    pooled = features(x, expert, trained)
    return _head_logits(heads, pooled, [(expert, slice(None))], num_classes)


def _segment_logits(features: Features, heads: nn.ModuleList, num_classes: int, x: Tensor, experts: Tensor,
                    trained: Optional[int]) -> Tensor:
    """The batch sorted by expert, each expert on its run of samples, put back in order at the end;
    a batch of one expert takes the single-expert path. One host sync: the runs' experts and bounds."""
    order = experts.argsort(stable=True)
    ids, counts = torch.unique_consecutive(experts[order], return_counts=True)
    layout = torch.cat((ids, counts)).tolist()  # the one host sync
    run_experts, run_lengths = layout[: len(ids)], layout[len(ids) :]
    if len(run_experts) == 1:
        return _single_expert_logits(features, heads, num_classes, x, run_experts[0], trained)
    bounds = [0, *accumulate(run_lengths)]
    segments: Segments = [(e, slice(a, b)) for e, a, b in zip(run_experts, bounds, bounds[1:])]
    logits = _head_logits(heads, features(x[order], segments, trained), segments, num_classes)
    unsorted = torch.empty_like(logits)
    unsorted[order] = logits
    return unsorted


def _head_logits(heads: nn.ModuleList, pooled: Tensor, segments: Segments, num_classes: int) -> Tensor:
    """Each expert's head on its run of ``pooled``, written to its classes; -inf elsewhere. The logits are in
    the heads' dtype (float32 beside a bfloat16 backbone, see :mod:`avalanche_color.lora.dtypes`)."""
    logits = pooled.new_full((pooled.shape[0], num_classes), float("-inf"), dtype=trained_dtype(pooled.dtype))
    for expert, run in segments:
        head = heads[expert]
        logits[run, head.classes] = head(pooled[run]).to(logits.dtype)  # under autocast the head may differ
    return logits
