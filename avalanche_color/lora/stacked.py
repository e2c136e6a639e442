"""Per-expert weights stacked on a first axis, for kernels that gather each sample's expert.

A batch that mixes experts can be computed with fixed shapes and no host sync when every
expert's weights sit in one tensor: each sample's factors are gathered by its expert index.
Stacking copies the weights (one kernel per stack), so the stacks are cached and built again
only when a source tensor changes: written in place (its version counter moves), moved or cast
(its storage or dtype changes), or experts are added. The expert that trains changes at every
step: its slot is taken live from its parameters at each forward (:func:`with_live_slot`), so
gradients reach it and the cache need not follow it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Optional
from weakref import WeakKeyDictionary

import torch
from torch import Tensor, nn

# owner module -> (key of the sources the stacks were built from, the stacks). Weak: a deleted or
# copied model never finds another's stacks.
_STACKS: WeakKeyDictionary[nn.Module, tuple[tuple, tuple[Tensor, ...]]] = WeakKeyDictionary()

SourceKey = tuple


def source_key(tensors: Sequence[Tensor], *extra: object) -> SourceKey:
    """What identifies the current values of ``tensors``: storage, version counter, dtype and device."""
    return (*extra, *((t.data_ptr(), t._version, t.dtype, t.device) for t in tensors))


def cached_stacks(owner: nn.Module, key: SourceKey, build: Callable[[], tuple[Tensor, ...]]) -> tuple[Tensor, ...]:
    """``build()``'s tensors (built without gradients), built again only when ``key`` differs from last time."""
    cached = _STACKS.get(owner)
    if cached is not None and cached[0] == key:
        return cached[1]
    # Plain tensors even when first built under inference mode: a later forward with gradients may use them.
    with torch.inference_mode(False), torch.no_grad():
        stacks = build()
    _STACKS[owner] = (key, stacks)
    return stacks


def with_live_slot(stack: Tensor, index: Optional[int], live: Tensor) -> Tensor:
    """``stack`` with slot ``index`` replaced by ``live`` (differentiable in ``live``); ``stack`` itself if
    ``index`` is None. Slices with Python ints: no index tensor, so nothing is copied from the host."""
    if index is None:
        return stack
    return torch.cat((stack[:index], live.unsqueeze(0).to(stack.dtype), stack[index + 1 :]))


def pad_dim(t: Tensor, dim: int, size: int) -> Tensor:
    """``t`` zero-padded at the end of ``dim`` to ``size`` (zeros add exactly nothing to a product)."""
    missing = size - t.shape[dim]
    if missing == 0:
        return t
    pad = [0, 0] * (t.dim() - dim % t.dim() - 1) + [0, missing]
    return nn.functional.pad(t, pad)
