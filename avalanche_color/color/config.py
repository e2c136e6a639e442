"""CoLoR's options: its LoRA experts (the model's options) and the whole method's config.

The option groups every routed-expert method shares (routing, prototypes, training, loaders)
and the checks are in :mod:`avalanche_color.config`.
"""

from __future__ import annotations

from typing import Optional

from avalanche_color.config import CANDIDATE_RULES, CandidateRule, RoutedExpertsConfig, RoutingOptions
from avalanche_color.utils.checks import boolean, one_of, option, option_group, optional, positive, positive_int


@option_group
class LoRAOptions(RoutingOptions):
    """CoLoR's model options: rank-r LoRA on the query and value projections of every block,
    and how samples are routed to the experts."""

    rank: int = option(64, positive_int, expert_setting=True,
                       doc="LoRA rank r on the query and value projections of every block (the paper: 64).")
    alpha: Optional[float] = option(None, optional(positive), expert_setting=True,
                                    doc="LoRA alpha; updates are scaled by ``alpha / rank``. None: ``rank``.")
    warm_start: bool = option(
        False, boolean,
        doc="beyond the paper: a new expert starts from the previous expert's LoRA weights (A and B) and, when its "
            "experience has exactly the previous expert's classes (a domain-incremental stream), from its head too; "
            "finished experts stay frozen. False: the paper's start, B = 0 (the new expert computes the backbone "
            "exactly) and a fresh head.")
    top_m: int = option(
        1, positive_int,
        doc="beyond the paper: the router proposes its m best experts per sample, the m candidates run as one "
            "mixed-expert batch (one routing pass, then m x batch rows) and ``top_m_rule`` picks the answer; "
            "1: the router's choice (the paper). Not with ``router=\"oracle\"``.")
    top_m_rule: CandidateRule = option(
        "router_product", one_of(CANDIDATE_RULES),
        doc='how top-m routing picks among the candidates: ``"router_product"``, the candidate whose largest '
            'softmax probability times the router\'s softmax over the candidates\' scores is largest (the best '
            'of the rules measured); ``"confidence"``, the one whose head gives the largest softmax probability. '
            'Unused with ``top_m=1``.')

    def _check_together(self) -> None:
        super()._check_together()
        if self.top_m > 1 and self.router == "oracle":
            raise ValueError(f"top_m={self.top_m} asks the router for several experts per sample, but "
                             f"router='oracle' knows one (the task label's): use top_m=1, or another router "
                             f"('prototypes', 'ridge', 'gaussian')")

    @property
    def scaling_alpha(self) -> float:
        return float(self.rank if self.alpha is None else self.alpha)


@option_group
class CoLoRConfig(LoRAOptions, RoutedExpertsConfig):
    """CoLoR's options, the keyword arguments of :class:`~avalanche_color.CoLoR`; the
    defaults are the paper's (rank 64, batch 128, 50 epochs, lr 1e-3, weight decay 2e-4, SGD with
    momentum 0.9, cosine schedule)."""
