"""Each method as the memory and timing rows run it: experiences added without training them, and one training step.

A learner grows its model with the method's own calls, as its strategy does around each experience:
:meth:`Learner.start` is the strategy's model adaptation (a new expert, component or head rows, InfLoRA's
designed ``A_t``, LoRA subtraction's projections), :meth:`Learner.finish` what follows training (weights as
if trained, prototypes, InfLoRA's protected subspaces, the expert or component frozen).
:meth:`Learner.optimizer` and :meth:`Learner.step` are the strategy's training step (:meth:`Learner.loss`
and one backward, except CL-LoRA's two gradients and two optimiser steps). Weights are random: memory and
time do not depend on them.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

COVARIANCE_IMAGES = 2  # random images whose inputs stand for an experience's (InfLoRA's subspaces, LoRA-Sub's P)
criterion = nn.CrossEntropyLoss()


def random_images(experience: int, image_size: tuple[int, int], device: torch.device) -> Tensor:
    """``COVARIANCE_IMAGES`` random images, the same for an experience whichever method draws them."""
    generator = torch.Generator().manual_seed(experience)
    return torch.randn(COVARIANCE_IMAGES, 3, *image_size, generator=generator).to(device)


class Learner:
    """One method's model and training step; ``classes`` new classes per experience."""

    name: ClassVar[str]

    def __init__(self, model: nn.Module, classes: int) -> None:
        self.model, self.classes = model, classes

    def classes_of(self, experience: int) -> list[int]:
        return list(range(experience * self.classes, (experience + 1) * self.classes))

    def labels(self, experience: int, batch: int, generator: torch.Generator) -> Tensor:
        """Random labels among the classes of ``experience``."""
        return torch.randint(0, self.classes, (batch,), generator=generator) + experience * self.classes

    def start(self, experience: int) -> None:
        raise NotImplementedError

    def finish(self, experience: int) -> None:
        raise NotImplementedError

    def optimizer(self) -> torch.optim.Optimizer:
        raise NotImplementedError

    def loss(self, x: Tensor, labels: Tensor) -> Tensor:
        return criterion(self.model(x), labels)

    def step(self, optimizer: torch.optim.Optimizer, x: Tensor, labels: Tensor) -> None:
        """One training step of the strategy: gradients cleared, the loss's backward, the optimiser's step."""
        optimizer.zero_grad(set_to_none=True)
        self.loss(x, labels).backward()
        optimizer.step()

    def learned_state(self) -> dict[str, Tensor]:
        """Everything learned, no backbone weight: what a checkpoint keeps."""
        return self.model.experts_state_dict()


def grown(learner: Learner, experiences: int) -> Learner:
    """``learner`` after ``experiences`` experiences, the last one being learned (``experiences - 1`` finished)."""
    for experience in range(experiences):
        if experience:
            learner.finish(experience - 1)
        learner.start(experience)
    return learner


def image_size(vit: nn.Module) -> tuple[int, int]:
    return tuple(vit.patch_embed.img_size)  # type: ignore[return-value]
