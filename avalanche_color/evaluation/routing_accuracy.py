"""Routing accuracy: how often the router picks the expert of a sample's own experience."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Literal, Optional

import torch
from avalanche.evaluation import GenericPluginMetric, Metric

if TYPE_CHECKING:
    from avalanche.evaluation.metric_results import MetricResult
    from avalanche.training.templates import SupervisedTemplate


class RoutedShare(Metric[Optional[float]]):
    """Share of samples routed to their own expert; ``None`` before any sample.

    It also counts the samples each expert answered (:attr:`experts`).
    """

    def __init__(self) -> None:
        self.correct = 0
        self.total = 0
        self.experts: Counter[int] = Counter()

    def update(self, correct: torch.Tensor, experts: Optional[torch.Tensor] = None) -> None:
        """Count a batch: ``correct`` says per sample whether it went to an expert of its own experience,
        ``experts`` (if given) which expert each sample went to."""
        self.correct += int(correct.sum())
        self.total += correct.numel()
        if experts is not None:
            self.experts.update(experts.tolist())

    def result(self) -> Optional[float]:
        return self.correct / self.total if self.total else None

    def reset(self) -> None:
        self.correct = 0
        self.total = 0
        self.experts = Counter()


class RoutingAccuracy(GenericPluginMetric[Optional[float], RoutedShare]):
    """Routing accuracy of a routed expert model (CoLoR's ``ExpertViT``, S-Prompts') in evaluation.

    A test sample is routed correctly when its expert is one trained on the
    experience it comes from (train and test streams line up experience by
    experience). Experiences without an expert yet are left out, not counted
    as wrong. The experts are those the strategy's evaluation forward routed the
    batch to (``strategy.mb_experts``, all ranks' under torchrun); :meth:`expert_counts` says how
    many samples each answered since the last reset.
    """

    def __init__(self, reset_at: Literal["experience", "stream"], emit_at: Literal["experience", "stream"]):
        super().__init__(RoutedShare(), reset_at=reset_at, emit_at=emit_at, mode="eval")
        self._name = "RoutingAcc_Exp" if emit_at == "experience" else "RoutingAcc_Stream"

    def update(self, strategy: "SupervisedTemplate") -> None:
        model = strategy.model
        routed = getattr(strategy, "mb_experts", None)
        if routed is None:
            return
        experience = strategy.experience.current_experience
        if bool((model.expert_experiences == experience).any()):  # a revisited experience has several experts
            routed = routed.to(model.expert_experiences.device)
            self._metric.update(model.expert_experiences[routed] == experience, routed)

    @property
    def per_experience(self) -> bool:
        """Whether it is reset and emitted per evaluation experience (else per stream)."""
        return self._emit_at == "experience"

    def expert_counts(self) -> dict[int, int]:
        """Expert index -> the samples it answered, since the last reset."""
        return dict(sorted(self._metric.experts.items()))

    def _package_result(self, strategy: "SupervisedTemplate") -> "MetricResult":
        if self.result() is None:
            return None
        return super()._package_result(strategy)

    def __str__(self) -> str:
        return self._name


def routing_accuracy_metrics(*, experience: bool = True, stream: bool = True) -> list[RoutingAccuracy]:
    """Routing-accuracy metrics for an ``EvaluationPlugin``, per experience and/or stream."""
    metrics = []
    if experience:
        metrics.append(RoutingAccuracy(reset_at="experience", emit_at="experience"))
    if stream:
        metrics.append(RoutingAccuracy(reset_at="stream", emit_at="stream"))
    return metrics
