"""Routing accuracy: how often the router picks the expert of a sample's own experience.

The counts stay on the model's device while batches come (no host sync per evaluation batch);
they are read once, when the metric's result is asked for.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Literal, Optional

import torch
from avalanche.evaluation import GenericPluginMetric, Metric

from avalanche_color.experts.routed_vit import RoutedExpertViT
from avalanche_color.utils.host_values import host_value

if TYPE_CHECKING:
    from avalanche.evaluation.metric_results import MetricResult
    from avalanche.training.templates import SupervisedTemplate


class RoutedShare(Metric[Optional[float]]):
    """Share of samples routed to their own expert; ``None`` before any sample.

    It also counts the samples each expert answered (:attr:`experts`).
    """

    def __init__(self) -> None:
        self.total = 0
        self._correct: Optional[torch.Tensor] = None  # on the device of the batches: summed without a sync
        self._experts: Optional[torch.Tensor] = None  # samples per expert index, on that device

    def update(self, correct: torch.Tensor, experts: Optional[torch.Tensor] = None,
               num_experts: Optional[int] = None) -> None:
        """Count a batch: ``correct`` says per sample whether it went to an expert of its own experience,
        ``experts`` (if given) which expert each sample went to, each below ``num_experts`` (None: read
        from ``experts``, a host sync)."""
        counted = correct.sum()
        self._correct = counted if self._correct is None else self._correct + counted.to(self._correct.device)
        self.total += correct.numel()
        if experts is not None:
            experts = experts.flatten().long()
            size = int(experts.max()) + 1 if num_experts is None else num_experts
            counts = self._experts
            if counts is None or counts.device != experts.device:
                counts = torch.zeros(size, dtype=torch.long, device=experts.device)
            elif len(counts) < size:
                counts = torch.nn.functional.pad(counts, (0, size - len(counts)))
            self._experts = counts.scatter_add(0, experts, torch.ones_like(experts))

    @property
    def correct(self) -> int:
        """Samples routed to their own expert (read on the host)."""
        return 0 if self._correct is None else int(self._correct)

    @property
    def experts(self) -> Counter[int]:
        """Expert index -> the samples it answered (read on the host)."""
        if self._experts is None:
            return Counter()
        return Counter({expert: count for expert, count in enumerate(self._experts.tolist()) if count})

    def result(self) -> Optional[float]:
        return self.correct / self.total if self.total else None

    def reset(self) -> None:
        self.total = 0
        self._correct = None
        self._experts = None


class RoutingAccuracy(GenericPluginMetric[Optional[float], RoutedShare]):
    """Routing accuracy of a routed expert model (CoLoR's ``ExpertViT``, S-Prompts') in evaluation.

    A test sample is routed correctly when its expert is one trained on the
    experience it comes from (train and test streams line up experience by
    experience). Experiences without an expert yet are left out, not counted
    as wrong. The experts are those the model's evaluation forward routed the
    batch to (``strategy.model.routed_experts``, all ranks' under torchrun; a model that routes
    nothing is not counted); :meth:`expert_counts` says how many samples each answered since the
    last reset.
    """

    def __init__(self, reset_at: Literal["experience", "stream"], emit_at: Literal["experience", "stream"]):
        super().__init__(RoutedShare(), reset_at=reset_at, emit_at=emit_at, mode="eval")
        self._name = "RoutingAcc_Exp" if emit_at == "experience" else "RoutingAcc_Stream"

    def update(self, strategy: "SupervisedTemplate") -> None:
        model = strategy.model
        if not isinstance(model, RoutedExpertViT) or model.routed_experts is None:
            return
        experience = strategy.experience.current_experience
        origins = model.bank.experiences
        # Each expert's experience, as Python ints read once per expert added (not per batch).
        if experience in host_value(model.bank, "experiences", origins, lambda tensor: tensor.tolist()):
            routed = model.routed_experts.to(origins.device)  # a revisited experience has several experts
            self._metric.update(origins[routed] == experience, routed, num_experts=len(origins))

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
