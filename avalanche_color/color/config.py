"""CoLoR's options: its LoRA experts (the model's options) and the whole method's config.

The option groups every routed-expert method shares (routing, prototypes, training, loaders)
and the checks are in :mod:`avalanche_color.config`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from avalanche_color.config import RoutedExpertsConfig, RoutingOptions, option
from avalanche_color.utils.checks import optional, positive, positive_int


@dataclass(frozen=True, kw_only=True)
class LoRAOptions(RoutingOptions):
    """CoLoR's model options: rank-r LoRA on the query and value projections of every block,
    and how samples are routed to the experts.

    Attributes:
        rank: LoRA rank r (the paper: 64).
        alpha: LoRA alpha; updates are scaled by ``alpha / rank``. None means ``rank``.
    """

    rank: int = option(64, positive_int, expert_setting=True)
    alpha: Optional[float] = option(None, optional(positive), expert_setting=True)

    @property
    def scaling_alpha(self) -> float:
        return float(self.rank if self.alpha is None else self.alpha)


@dataclass(frozen=True, kw_only=True)
class CoLoRConfig(LoRAOptions, RoutedExpertsConfig):
    """CoLoR's options, the fields of :class:`~avalanche_color.CoLoR`'s keyword arguments; the
    defaults are the paper's (rank 64, batch 128, 50 epochs, lr 1e-3, weight decay 2e-4, SGD with
    momentum 0.9, cosine schedule)."""
