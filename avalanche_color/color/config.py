"""CoLoR's options: its LoRA experts (the model's options) and the whole method's config.

The option groups every routed-expert method shares (routing, prototypes, training, loaders)
and the checks are in :mod:`avalanche_color.config`.
"""

from __future__ import annotations

from typing import Optional

from avalanche_color.config import (CANDIDATE_RULES, CONFIDENCE_SCORES, REMATCHING, REMATCHING_CANDIDATES,
                                    CandidateRule, ConfidenceScore, Rematching, RematchingCandidate,
                                    RoutedExpertsConfig, RoutingOptions)
from avalanche_color.utils.checks import (boolean, finite_number, one_of, option, option_group, optional, positive,
                                          positive_int)

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
    rematching: Rematching = option(
        "off", one_of(REMATCHING),
        doc='beyond the paper: HRM-PET\'s re-matching of the routed expert from its first prediction, which is '
            'every expert\'s head on the routed expert\'s features. ``"direct"``: where the best (expert, class) of '
            'that prediction is a class of another expert alone, that expert answers; ``"confidence"``: where the '
            'prediction\'s confidence (``rematching_score``) is below ``rematching_tau``, the second candidate '
            '(``rematching_candidate``) runs too and the one of larger energy 0.1 logsumexp(logits / 0.1) answers; '
            '``"hybrid"``: both, in that order (HRM-PET). ``"off"``: the router\'s choice (the paper). Not with '
            '``top_m`` > 1 or ``router="oracle"``.')
    rematching_score: ConfidenceScore = option(
        "gen", one_of(CONFIDENCE_SCORES),
        doc='how confident a first prediction is, from its softmax over every expert\'s classes: ``"gen"``, the '
            'generalised entropy score -sum over the 20 largest probabilities of p^0.1 (1 - p)^0.1 (HRM-PET\'s '
            'default); ``"msp"``, the largest probability.')
    rematching_tau: float = option(
        -10.0, finite_number,
        doc='the confidence below which ``"confidence"`` and ``"hybrid"`` re-matching try the second candidate '
            '(HRM-PET\'s default -10, for ``"gen"``, whose scores lie in [-17.5, 0]: with fewer than 14 (expert, '
            'class) pairs no score is below it); with ``rematching_score="msp"`` a number in [0, 1].')
    rematching_candidate: RematchingCandidate = option(
        "class", one_of(REMATCHING_CANDIDATES),
        doc='the second candidate of confidence re-matching: ``"class"``, the expert of the first prediction\'s '
            'second-best (expert, class) where that class is its alone (HRM-PET\'s, the task of the second-best '
            'class; a domain-incremental stream has none); ``"router"``, the router\'s second-ranked expert.')

    def _check_together(self) -> None:
        super()._check_together()
        if self.top_m > 1 and self.router == "oracle":
            raise ValueError(f"top_m={self.top_m} asks the router for several experts per sample, but "
                             f"router='oracle' knows one (the task label's): use top_m=1, or another router "
                             f"('prototypes', 'ridge', 'gaussian')")
        if self.rematching != "off" and self.router == "oracle":
            raise ValueError(f"rematching={self.rematching!r} moves a sample away from its routed expert, but "
                             f"router='oracle' routes by the task label, the right expert: use rematching='off', "
                             f"or another router ('prototypes', 'ridge', 'gaussian')")
        if self.rematching != "off" and self.top_m > 1:
            raise ValueError(f"rematching={self.rematching!r} and top_m={self.top_m} both choose the expert that "
                             f"answers: use one of them (rematching='off' or top_m=1)")
        if self.rematching_score == "msp" and not 0 <= self.rematching_tau <= 1:
            raise ValueError(f"rematching_tau must be a number in [0, 1] with rematching_score='msp' (a largest "
                             f"probability), got {self.rematching_tau!r} (-10.0 is HRM-PET's threshold for 'gen')")

    @property
    def scaling_alpha(self) -> float:
        return float(self.rank if self.alpha is None else self.alpha)


@option_group
class CoLoRConfig(LoRAOptions, RoutedExpertsConfig):
    """CoLoR's options, the keyword arguments of :class:`~avalanche_color.CoLoR`; the
    defaults are the paper's (rank 64, batch 128, 50 epochs, lr 1e-3, weight decay 2e-4, SGD with
    momentum 0.9, cosine schedule)."""
