"""CL-LoRA's class prototypes (``replace_fc`` of ``models/cllora.py``): per class of an experience, the mean
raw feature of its training images (evaluation transforms) under that experience's network, computed
when the experience ends and never updated."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from avalanche.benchmarks.utils.data_loader import collate_from_data_or_kwargs
from torch import Tensor

from avalanche_color.peers.cl_lora.model import CLLoRAViT
from avalanche_color.utils.rng import generators_untouched


def collate_options(dataset: Any) -> dict[str, Any]:
    """The data set's own collate function, as Avalanche's loaders take it."""
    collate: dict[str, Any] = {}
    collate_from_data_or_kwargs(dataset, collate)
    return collate


def experience_prototypes(model: CLLoRAViT, experience: int, batches: Iterable[Any]) -> Tensor:
    """:func:`class_means` in eval mode (then the mode as it was), the random generators left as they were."""
    was_training = model.training
    model.eval()
    try:
        with generators_untouched():
            return class_means(model, experience, batches, model.device)
    finally:
        model.train(was_training)


@torch.no_grad()
def class_means(model: CLLoRAViT, experience: int, batches: Iterable[Any], device: torch.device) -> Tensor:
    """(classes, features): the mean of ``model.experience_features`` per class of ``experience``, in the
    order of ``model.experiences.class_ids(experience)``; summed in float64. A class with no image keeps zeros."""
    classes = model.experiences.class_ids(experience)
    local = torch.full((max(classes) + 1,), -1, dtype=torch.long, device=device)
    local[classes] = torch.arange(len(classes), device=device)
    sums, counts = None, torch.zeros(len(classes), dtype=torch.float64, device=device)
    for batch in batches:
        x, y = batch[0].to(device), batch[1].to(device)
        features = model.experience_features(x, experience).double()
        keep = (y <= local.shape[0] - 1) & (local[y.clamp(max=local.shape[0] - 1)] >= 0)
        index = local[y[keep]]
        if sums is None:
            sums = features.new_zeros(len(classes), features.shape[1])
        sums.index_add_(0, index, features[keep])
        counts.index_add_(0, index, torch.ones_like(index, dtype=torch.float64))
    if sums is None:
        return model.experiences.prototypes.new_zeros(len(classes), model.experiences.prototypes.shape[1])
    return sums / counts.clamp_min(1).unsqueeze(1)
