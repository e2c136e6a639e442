"""CoLoR's options: its LoRA experts (the model's options) and the whole method's config.

The option groups every routed-expert method shares (routing, prototypes, training, loaders)
and the checks are in :mod:`avalanche_color.config`.
"""

from __future__ import annotations

from typing import Optional

from avalanche_color.config import RoutedExpertsConfig, RoutingOptions
from avalanche_color.utils.checks import option, option_group, optional, positive, positive_int


@option_group
class LoRAOptions(RoutingOptions):
    """CoLoR's model options: rank-r LoRA on the query and value projections of every block,
    and how samples are routed to the experts."""

    rank: int = option(64, positive_int, expert_setting=True,
                       doc="LoRA rank r on the query and value projections of every block (the paper: 64).")
    alpha: Optional[float] = option(None, optional(positive), expert_setting=True,
                                    doc="LoRA alpha; updates are scaled by ``alpha / rank``. None: ``rank``.")

    @property
    def scaling_alpha(self) -> float:
        return float(self.rank if self.alpha is None else self.alpha)


@option_group
class CoLoRConfig(LoRAOptions, RoutedExpertsConfig):
    """CoLoR's options, the keyword arguments of :class:`~avalanche_color.CoLoR`; the
    defaults are the paper's (rank 64, batch 128, 50 epochs, lr 1e-3, weight decay 2e-4, SGD with
    momentum 0.9, cosine schedule)."""
