"""RanPAC (McDonnell et al., NeurIPS 2023) as a training-free baseline on the frozen backbone.

The backbone's pooled features (not normalised, as RanPAC uses them) go through a fixed
random projection with ReLU, M = 2,048 wide (RanPAC uses 10,000 for ViT-B/16's 768-wide
features; 2,048 keeps the M³ solve cheap on a CPU, and is what CoLoR's ridge router uses);
a ridge readout onto the classes is solved in closed form from the accumulated Gram
matrix after each experience, λ chosen on a held-out 20% of that experience
(:class:`~avalanche_color.routing.ridge.RandomFeatureRidge`). RanPAC's first-session
adaptation of the backbone is left out: like NCM, nothing trains.
"""

from __future__ import annotations

from typing import Any

import torch
from avalanche.core import SupervisedPlugin
from avalanche.training.templates import SupervisedTemplate
from torch import Tensor, nn

from avalanche_color import RandomFeatureRidge
from avalanche_color.runner.methods.features import experience_features

WIDTH = 2048
SEED = 0


class RanPACModel(nn.Module):
    """A frozen headless ViT and a closed-form ridge readout over ``num_classes`` (-inf for a class not seen)."""

    def __init__(self, vit: nn.Module, num_classes: int, width: int = WIDTH) -> None:
        super().__init__()
        self.backbone = vit.requires_grad_(False).eval()
        self.num_classes = num_classes
        self.ridge = RandomFeatureRidge(vit.num_features, width, seed=SEED)

    def forward(self, x: Tensor) -> Tensor:
        features = self.backbone(x)
        scores = features.new_full((x.shape[0], self.num_classes), float("-inf"))
        if self.ridge.num_targets:
            seen = self.ridge.moments.any(dim=0)  # a class with no sample keeps -inf
            fitted = self.ridge(features)
            scores[:, : self.ridge.num_targets] = fitted.masked_fill(~seen, float("-inf"))
        return scores

    def train(self, mode: bool = True) -> "RanPACModel":
        super().train(mode)
        self.backbone.eval()
        return self


class RidgeUpdate(SupervisedPlugin):
    """After each experience: its features (eval transforms) added to the ridge, the readout solved again."""

    def after_training_exp(self, strategy: SupervisedTemplate, **kwargs: Any) -> None:
        model: RanPACModel = strategy.model
        features, labels = zip(*experience_features(strategy, model.backbone, kwargs))
        model.ridge.fit(torch.cat(features), torch.cat(labels), keep=True)
