"""LoRA subtraction's classifier: class-mean prototypes and the nearest-mean rule (NME).

From the authors' ``methods/lorasub_drs.py``: at the end of each task, per new class, the mean raw
feature of its training images (test transform) under the network after the task
(``_build_protos``), never updated later; at evaluation, ``argmin_c ||c/||c|| - f/(||f|| + 1e-8)||^2``
(``_eval_model``, scipy's ``cdist(..., 'sqeuclidean')``).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

FEATURE_EPS = 1e-8  # the code's EPSILON in f / (||f|| + eps)


@torch.no_grad()
def class_means(batches: Iterable[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """``(classes, means)``: the classes present in ``(features, labels)`` batches, ascending, and the
    mean feature of each (summed in float64, returned in float64)."""
    total = count = None  # running (classes so far, d) sums and (classes so far,) counts
    for features, labels in batches:
        features = features.to(torch.float64)
        one_hot = nn.functional.one_hot(labels.to(features.device).long()).to(torch.float64)
        batch_total, batch_count = one_hot.T @ features, one_hot.sum(0)
        if total is None or count is None:
            total, count = batch_total, batch_count
            continue
        size = max(len(count), len(batch_count))
        total = _padded(total, size) + _padded(batch_total, size)
        count = _padded(count, size) + _padded(batch_count, size)
    if total is None or count is None:
        raise ValueError("class_means needs at least one batch")
    classes = torch.nonzero(count).flatten()
    return classes, total[classes] / count[classes, None]


def _padded(values: Tensor, size: int) -> Tensor:
    """``values`` with zero rows appended up to ``size`` rows."""
    return torch.cat((values, values.new_zeros(size - len(values), *values.shape[1:])))


def nearest_mean_logits(features: Tensor, prototypes: Tensor, prototype_classes: Tensor, num_classes: int) -> Tensor:
    """(n, num_classes): minus the squared distance of each normalised feature to the nearest normalised
    prototype of each class (the class of the nearest prototype wins); ``-inf`` for a class without one.
    Computed in the prototypes' dtype."""
    f = features.to(prototypes.dtype)
    f = f / (f.norm(dim=1, keepdim=True) + FEATURE_EPS)
    centres = prototypes / prototypes.norm(dim=1, keepdim=True)
    squared = (f.square().sum(1, keepdim=True) + centres.square().sum(1)[None, :] - 2 * f @ centres.T).clamp(min=0)
    logits = f.new_full((len(f), num_classes), float("-inf"))
    index = prototype_classes[None, :].expand(len(f), -1)
    return logits.scatter_reduce(1, index, -squared, reduce="amax")
