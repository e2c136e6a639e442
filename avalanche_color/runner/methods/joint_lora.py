"""Joint-LoRA: one CoLoR expert trained on the whole stream at once, as CoLoR trains an expert."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from avalanche.training import JointTraining
from torch import Tensor, nn

from avalanche_color import ExpertViT, PerExperienceCosine


class SingleLoRAExpert(nn.Module):
    """Joint-LoRA's model: CoLoR's :class:`ExpertViT` with a single expert, its head over ``classes``.

    One CoLoR expert (rank-r LoRA on q and v of every block of the frozen ViT) trained on the
    whole stream; with one expert there is nothing to route, so it always predicts.
    """

    def __init__(self, vit: nn.Module, rank: int, classes: Sequence[int]) -> None:
        super().__init__()
        self.experts = ExpertViT(vit, rank=rank)
        self.experts.add_expert(list(classes), experience=0)

    def forward(self, x: Tensor) -> Tensor:
        return self.experts.predict(x, 0)


class JointExpertTraining(PerExperienceCosine, JointTraining):
    """Avalanche's ``JointTraining`` of a :class:`SingleLoRAExpert`, trained as CoLoR trains an
    expert: the given SGD (the expert's parameters only) with a cosine schedule over all steps.

    The model is complete before training: ``JointTraining`` adapts every dynamic module to every
    experience, which would give the ExpertViT one more expert per experience.
    """

    def model_adaptation(self, model: Optional[nn.Module] = None) -> nn.Module:
        return (self.model if model is None else model).to(self.device)

    def make_optimizer(self, **kwargs: Any) -> None:
        self.restart_cosine()
