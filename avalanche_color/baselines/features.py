"""The features a training-free baseline fits its classifier with: the frozen ViT's pooled features of
an experience's training data, batch by batch."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Callable

import torch
from avalanche.training.templates import SupervisedTemplate
from torch import Tensor, nn

from avalanche_color.training.loaders import data_loader, loader_options


def pooled_features(vit: nn.Module, x: Tensor) -> Tensor:
    """The timm ViT's pooled features before its head, (batch, num_features): what ``vit(x)`` gives
    for a headless ViT (``num_classes=0``), and the same for a ViT with a classifier head."""
    return vit.forward_head(vit.forward_features(x), pre_logits=True)


@torch.no_grad()
def experience_features(strategy: SupervisedTemplate, extract: Callable[[Tensor], Tensor],
                        call_options: Mapping[str, Any]) -> Iterator[tuple[Tensor, Tensor]]:
    """``(extract(x), y)`` for each batch of the current experience's data with its eval transforms,
    in order, with the model in eval mode (its mode is restored afterwards). ``call_options``: the
    keywords of the ``train`` call (a plugin callback's ``kwargs``), whose loader options
    (``num_workers``, ...) this loader takes."""
    model = strategy.model
    training = model.training
    model.eval()
    try:
        loader = data_loader(strategy.experience.dataset.eval(), loader_options(call_options), strategy.device,
                             batch_size=strategy.train_mb_size, shuffle=False)
        for x, y, *_ in loader:
            features = extract(x.to(strategy.device))
            yield features, y.to(features.device)
    finally:
        model.train(training)
