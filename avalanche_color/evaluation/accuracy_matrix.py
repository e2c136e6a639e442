"""The accuracy matrix of a run, assembled from Avalanche's metric values as they are logged.

Row ``i`` is the evaluation after the ``i``-th training experience (the last evaluation that
ended after it started, so an evaluation during training, e.g. Avalanche's periodic one, is
replaced by a later one); column ``j`` is test experience ``j``, read from the
``Top1_Acc_Exp/eval_phase/<stream>/TaskNNN/ExpNNN`` values (``accuracy_metrics(experience=True)``).
Forgetting is Avalanche's: a test experience's accuracy just after its own training experience
(the latest, if it was trained again), minus its accuracy now. Routing accuracy and the experts that answered each test experience come
from :class:`~avalanche_color.evaluation.routing_accuracy.RoutingAccuracy`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

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
