"""What a run measures beyond Avalanche's metrics: routing accuracy, and the accuracy matrix.

**Routing accuracy** (:class:`RoutingAccuracy`, an Avalanche metric): how often the router picks the expert
of a sample's own experience. The counts stay on the model's device while batches come (no host sync per
evaluation batch); they are read once, when the metric's result is asked for.

**The accuracy matrix** of a run (:class:`AccuracyMatrix`), assembled from Avalanche's metric values as
they are logged. Row ``i`` is the evaluation after the ``i``-th training experience (the last evaluation that
ended after it started, so an evaluation during training, e.g. Avalanche's periodic one, is
replaced by a later one); column ``j`` is test experience ``j``, read from the
``Top1_Acc_Exp/eval_phase/<stream>/TaskNNN/ExpNNN`` values (``accuracy_metrics(experience=True)``).
Forgetting is Avalanche's: a test experience's accuracy just after its own training experience
(the latest, if it was trained again), minus its accuracy now. Routing accuracy and the experts that answered
each test experience come from :class:`RoutingAccuracy`.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Optional

import torch
from avalanche.evaluation import GenericPluginMetric, Metric

from avalanche_color.experts.routed_vit import RoutedExpertViT
from avalanche_color.utils.state import host_value

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
    batch to, which the strategy keeps beside its logits as ``strategy.mb_routed_experts`` (the package's
    strategies and the drop-in :class:`~avalanche_color.LoRAExpertsPlugin` set it; all ranks' under
    torchrun; a batch nothing routed is not counted); :meth:`expert_counts` says how many samples each
    answered since the last reset.
    """

    def __init__(self, reset_at: Literal["experience", "stream"], emit_at: Literal["experience", "stream"]):
        super().__init__(RoutedShare(), reset_at=reset_at, emit_at=emit_at, mode="eval")
        self._name = "RoutingAcc_Exp" if emit_at == "experience" else "RoutingAcc_Stream"

    def update(self, strategy: "SupervisedTemplate") -> None:
        model, routed = strategy.model, getattr(strategy, "mb_routed_experts", None)
        if not isinstance(model, RoutedExpertViT) or routed is None:
            return
        experience = strategy.experience.current_experience
        origins = model.bank.experiences
        # Each expert's experience, as Python ints read once per expert added (not per batch).
        if experience in host_value(model.bank, "experiences", origins, lambda tensor: tensor.tolist()):
            routed = routed.to(origins.device)  # a revisited experience has several experts
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


# ---------------------------------------------------------------------- the accuracy matrix

EXPERIENCE_ACCURACY = re.compile(r"^Top1_Acc_Exp/eval_phase/(?P<stream>[^/]+)/Task\d+/Exp(?P<experience>\d+)$")
STREAM_ACCURACY = re.compile(r"^Top1_Acc_Stream/eval_phase/(?P<stream>[^/]+)/Task(?P<task>\d+)$")
EXPERIENCE_ROUTING = re.compile(r"^RoutingAcc_Exp/eval_phase/(?P<stream>[^/]+)/Task\d+/Exp(?P<experience>\d+)$")


@dataclass
class Routing:
    """How one test experience was routed in the latest evaluation."""

    accuracy: Optional[float] = None
    experts: dict[int, int] = field(default_factory=dict)  # expert index -> samples it answered
    expert_experiences: dict[int, int] = field(default_factory=dict)  # expert index -> its training experience


@dataclass
class AccuracyMatrix:
    """Accuracies by (training experience done, test experience) for every evaluation stream."""

    trained: list[int] = field(default_factory=list)  # the training experiences, in the order trained
    rows: dict[str, dict[int, dict[int, float]]] = field(default_factory=dict)  # stream -> row -> column -> acc
    stream_accuracy: dict[str, dict[int, float]] = field(default_factory=dict)  # stream -> task -> latest
    routing: dict[str, dict[int, Routing]] = field(default_factory=dict)  # stream -> test experience -> latest

    def start_training(self, experience: int) -> None:
        """A training experience begins: later evaluations fill its row."""
        self.trained.append(experience)

    def observe(self, name: str, value: float) -> bool:
        """Take a logged metric value; whether it was one of the matrix's (or routing's)."""
        row = len(self.trained) - 1
        if (match := EXPERIENCE_ACCURACY.match(name)) is not None:
            if row < 0:  # an evaluation before any training has no row
                return False
            self.rows.setdefault(match["stream"], {}).setdefault(row, {})[int(match["experience"])] = float(value)
        elif (match := STREAM_ACCURACY.match(name)) is not None:
            self.stream_accuracy.setdefault(match["stream"], {})[int(match["task"])] = float(value)
        elif (match := EXPERIENCE_ROUTING.match(name)) is not None:
            self._routing(match["stream"], int(match["experience"])).accuracy = float(value)
        else:
            return False
        return True

    def observe_routing(self, stream: str, experience: int, experts: dict[int, int],
                        expert_experiences: dict[int, int]) -> None:
        """Which experts answered ``experience``'s test samples, and how many each."""
        routing = self._routing(stream, experience)
        routing.experts = dict(sorted(experts.items()))
        routing.expert_experiences = {e: expert_experiences[e] for e in routing.experts}

    def streams(self) -> list[str]:
        return sorted(self.rows)

    def columns(self, stream: str) -> list[int]:
        """The test experiences evaluated on ``stream`` so far."""
        return sorted({column for row in self.rows.get(stream, {}).values() for column in row})

    def matrix(self, stream: str) -> list[list[Optional[float]]]:
        """``[row][column]`` over the rows so far and :meth:`columns`; None where not evaluated."""
        rows = self.rows.get(stream, {})
        return [[rows.get(row, {}).get(column) for column in self.columns(stream)] for row in range(len(self.trained))]

    def forgetting(self, stream: str) -> dict[int, float]:
        """Per test experience: accuracy after its own (latest) training experience minus accuracy now.

        Only test experiences whose latest training came before the latest row, evaluated then and now.
        """
        rows = self.rows.get(stream, {})
        last = len(self.trained) - 1
        if last not in rows:
            return {}
        forgetting = {}
        for column, now in sorted(rows[last].items()):
            own = [row for row in range(last + 1) if self.trained[row] == column]
            if own and own[-1] < last and column in rows.get(own[-1], {}):
                forgetting[column] = rows[own[-1]][column] - now
        return forgetting

    def final_rows(self, stream: str) -> list[dict[str, Any]]:
        """One row per test experience of the latest evaluation: accuracy, forgetting, routing."""
        rows = self.rows.get(stream, {})
        last = len(self.trained) - 1
        forgetting = self.forgetting(stream)
        result = []
        for column, accuracy in sorted(rows.get(last, {}).items()):
            routing = self.routing.get(stream, {}).get(column, Routing())
            result.append({"test experience": column, "accuracy": accuracy, "forgetting": forgetting.get(column),
                           "routing accuracy": routing.accuracy,
                           "experts (samples)": ", ".join(f"{e}: {n}" for e, n in routing.experts.items()) or None})
        return result

    def _routing(self, stream: str, experience: int) -> Routing:
        return self.routing.setdefault(stream, {}).setdefault(experience, Routing())
