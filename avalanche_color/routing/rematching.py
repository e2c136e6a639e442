"""HRM-PET's hybrid re-matching: the routed expert is checked against its own first prediction.

HRM-PET (Wang, Jia, Liu, Lin, Yang, NeurIPS 2025; code: github wei-cheng777/HRM-PET,
``engines/hrm_lora_wtp_and_tap_engine.py``, ``evaluate``) routes each test image to a LoRA by a task-identity
classifier on frozen features, predicts over every class seen with that LoRA, and re-matches:

1. *direct*: where the class predicted belongs to another task than the LoRA's, that task's LoRA runs again and
   its logits are the answer;
2. *confidence* (with more than one task): where the first prediction's confidence (the generalised entropy
   score of its softmax, or its largest probability) is below a threshold ``tau``, the task of its second-best
   class runs too, and of the two logit vectors (the answer after step 1, and the candidate's) the one with the
   larger energy ``0.1 * logsumexp(logits / 0.1)`` is the answer.

The low-confidence samples and the second class are read from the first prediction, before step 1.

In CoLoR each expert's head covers only its experience's classes, so a prediction over every class seen is
made here of every expert's head on the routed expert's features, one (expert, class) pair per head output
(:func:`pair_logits`): HiDe-LoRA's shared head, on which HRM-PET runs, is likewise one row per class, each
trained on its own task's LoRA features. Where each class has one expert (class-incremental streams) the pairs
are HRM-PET's classes and a pair's expert is its class's task. A class that several experts have (every class,
in a domain-incremental stream) has no task in HRM-PET's class-to-task map, so neither step reads one from it
(:func:`pair_owners`): there the direct step leaves the sample with the router's expert and the ``"class"``
candidate is none; only the confidence step with the router's second-ranked expert applies. The answer is the final expert's own head (CoLoR's output), not the all-pair
logits. :class:`~avalanche_color.experts.routed_vit.RoutedExpertViT.rematch` runs the passes; this module holds
the rule. ``docs/fidelity.md`` lists every difference from HRM-PET's code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from avalanche_color.config import (CONFIDENCE_SCORES, REMATCHING, REMATCHING_CANDIDATES, ConfidenceScore, Rematching,
                                    RematchingCandidate)
from avalanche_color.utils.checks import finite_number, one_of, require

# HRM-PET's constants: generalized_entropy(softmax, 0.1, 20) and the energy's 0.1 * logsumexp(logits / 0.1).
GEN_GAMMA = 0.1
GEN_TOP = 20
ENERGY_TEMPERATURE = 0.1


@dataclass(frozen=True)
class RematchingRule:
    """Which re-matching steps run and their settings (CoLoR's ``rematching*`` options).

    Attributes:
        mode: ``"direct"``, ``"confidence"`` or ``"hybrid"`` (both, direct first).
        score: how a first prediction's confidence is scored (:func:`confidence_scores`).
        tau: the confidence below which the second candidate is tried.
        candidate: the second candidate: ``"class"``, the expert of the second-best pair of the first
            prediction (HRM-PET's); ``"router"``, the router's second-ranked expert.
    """

    mode: Rematching = "hybrid"
    score: ConfidenceScore = "gen"
    tau: float = -10.0
    candidate: RematchingCandidate = "class"

    def __post_init__(self) -> None:
        require("rematching", self.mode, one_of(tuple(m for m in REMATCHING if m != "off")))
        require("rematching_score", self.score, one_of(CONFIDENCE_SCORES))
        require("rematching_tau", self.tau, finite_number)
        require("rematching_candidate", self.candidate, one_of(REMATCHING_CANDIDATES))

    @property
    def direct(self) -> bool:
        return self.mode in ("direct", "hybrid")

    @property
    def confidence(self) -> bool:
        return self.mode in ("confidence", "hybrid")


class FirstPrediction(NamedTuple):
    """What re-matching reads of a first prediction (B samples).

    Attributes:
        best: (B,) the expert whose class is each sample's best (expert, class) pair's: the direct step's expert;
            -1 where that class belongs to several experts (no class-to-task map: the direct step keeps the
            router's expert).
        second: (B,) the same of its second-best pair: the confidence step's ``"class"`` candidate (-1: none).
        low_confidence: (B,) whether its confidence is below ``tau``.
    """

    best: Tensor
    second: Tensor
    low_confidence: Tensor


class Rematched(NamedTuple):
    """A re-matched batch (B samples).

    Attributes:
        logits: (B, classes) the answering expert's global-class logits (-inf outside its classes).
        experts: (B,) the answering expert.
        first: (B,) the router's expert.
        direct: (B,) whether the direct step moved the sample (its best pair's class is another expert's).
        low_confidence: (B,) whether the confidence step tried a second candidate (the answer may stay).
    """

    logits: Tensor
    experts: Tensor
    first: Tensor
    direct: Tensor
    low_confidence: Tensor


def pair_logits(weight: Tensor, bias: Tensor, columns: Tensor, features: Tensor) -> Tensor:
    """(B, experts, C) every expert's head on each sample's ``features`` (B, F), -inf where a head is padded.

    ``weight`` (experts, C, F), ``bias`` (experts, C) and ``columns`` (experts, C), the heads' class ids, -1 where
    padded: the stacked heads (:func:`~avalanche_color.experts.routed_vit.stacked_heads`).
    """
    logits = torch.einsum("bf,ecf->bec", features.to(weight.dtype), weight) + bias
    return logits.masked_fill(columns < 0, float("-inf"))


def generalized_entropy(probabilities: Tensor, gamma: float = GEN_GAMMA, top: int = GEN_TOP) -> Tensor:
    """(B,) HRM-PET's ``generalized_entropy``: minus the sum, over the ``top`` largest probabilities of each row,
    of p^gamma (1 - p)^gamma (GEN, Liu et al. 2023). Higher is more confident; a probability 0 adds nothing."""
    largest = probabilities.topk(min(top, probabilities.shape[1]), dim=1).values
    return -(largest.pow(gamma) * (1 - largest).pow(gamma)).sum(dim=1)


def confidence_scores(probabilities: Tensor, score: ConfidenceScore) -> Tensor:
    """(B,) the confidence of each row of softmax ``probabilities``: ``"gen"`` (:func:`generalized_entropy`) or
    ``"msp"``, the largest probability."""
    require("rematching_score", score, one_of(CONFIDENCE_SCORES))
    if score == "msp":
        return probabilities.amax(dim=1)
    return generalized_entropy(probabilities)


def energy(logits: Tensor) -> Tensor:
    """(B,) HRM-PET's energy of each sample's logits (over every dimension but the first):
    ``0.1 * logsumexp(logits / 0.1)``, a soft maximum (-inf entries add nothing)."""
    flat = logits.flatten(1)
    return ENERGY_TEMPERATURE * torch.logsumexp(flat / ENERGY_TEMPERATURE, dim=1)


def pair_owners(columns: Tensor, num_classes: int) -> Tensor:
    """(experts, C) HRM-PET's class-to-task map on the pairs: the expert of each pair where its class belongs to
    that expert alone, -1 where several experts have the class (a domain-incremental stream) or the head is
    padded. ``columns``: the stacked heads' class ids, -1 where padded."""
    valid = columns >= 0
    counts = torch.bincount(columns[valid], minlength=num_classes)
    experts = torch.arange(columns.shape[0], device=columns.device)[:, None].expand_as(columns)
    return torch.where(valid & (counts[columns.clamp(min=0)] == 1), experts, -1)


def first_prediction(pairs: Tensor, owners: Tensor, rule: RematchingRule) -> FirstPrediction:
    """What ``rule`` reads of a first prediction ``pairs`` (B, experts, C), -inf where padded: the owners
    (:func:`pair_owners`) of the best and second-best pairs' classes (-1: a class of several experts), and
    whether the softmax over all pairs is less confident than ``rule.tau``."""
    top = pairs.flatten(1).topk(2, dim=1).indices
    low = confidence_scores(pairs.flatten(1).softmax(dim=1), rule.score) < rule.tau
    flat_owners = owners.flatten()
    return FirstPrediction(flat_owners[top[:, 0]], flat_owners[top[:, 1]], low)
