"""The features of an experience's training data, batch by batch: what the training-free baselines fit."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Callable

import torch
from avalanche.training.templates import SupervisedTemplate
from torch import Tensor
from torch.utils.data import DataLoader


@torch.no_grad()
def experience_features(strategy: SupervisedTemplate, extract: Callable[[Tensor], Tensor]) -> Iterator[tuple[Tensor, Tensor]]:
    """``(extract(x), y)`` for each batch of the current experience's data with its eval transforms,
    in order, with the model in eval mode (its mode is restored afterwards)."""
    model = strategy.model
    training = model.training
    model.eval()
    try:
        loader = DataLoader(strategy.experience.dataset.eval(), batch_size=strategy.train_mb_size, shuffle=False)
        for x, y, *_ in loader:
            features = extract(x.to(strategy.device))
            yield features, y.to(features.device)
    finally:
        model.train(training)
