"""WandBReport: what :class:`~avalanche_color.evaluation.wandb_logger.WandBLogger` adds to its run beyond
Avalanche's values: the accuracy matrix (table and heatmap), forgetting, routing, the results table, and the
names of the non-finite values left out.

Mixed into the logger; it uses the logger's ``wandb``, ``_run`` and ``_log``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional

from avalanche_color.evaluation.accuracy_matrix import AccuracyMatrix
from avalanche_color.evaluation.routing_accuracy import RoutingAccuracy
from avalanche_color.evaluation.wandb_values import matrix_values, results_values

if TYPE_CHECKING:
    from avalanche.evaluation.metric_results import MetricValue
    from avalanche.training.templates import SupervisedTemplate
    from wandb import Run


class WandBReport:
    """The report half of :class:`~avalanche_color.evaluation.wandb_logger.WandBLogger` (see its docstring)."""

    _matrix_changed: bool = False  # since the matrix was last logged
    _results_logged: bool = True  # since the matrix last changed
    _report_finished_for: Optional["Run"] = None
    _avalanche_forgetting: bool = False  # Avalanche's forgetting metrics logged: no Forgetting_* panels of our own

    @property
    def accuracy_matrix(self) -> AccuracyMatrix:
        """The accuracies, forgetting and routing gathered so far (what the tables show)."""
        if "_matrix" not in self.__dict__:
            self._matrix = AccuracyMatrix()
        return self._matrix

    @property
    def skipped_non_finite(self) -> set[str]:
        """The names of the metrics whose infinite or NaN values were not logged."""
        if "_skipped" not in self.__dict__:
            self._skipped: set[str] = set()
        return self._skipped

    def after_eval_exp(self, strategy: "SupervisedTemplate", metric_values: List["MetricValue"],
                       **kwargs: Any) -> None:
        """Record which experts answered this experience's samples (from the routing-accuracy metric)."""
        experience = strategy.experience
        for metric in getattr(strategy.evaluator, "metrics", ()):
            counts = metric.expert_counts() if isinstance(metric, RoutingAccuracy) and metric.per_experience else {}
            if counts:
                trained_on = dict(enumerate(int(e) for e in strategy.model.bank.experiences.tolist()))
                stream = f"{experience.origin_stream.name}_stream"  # as Avalanche's metric names say it
                self.accuracy_matrix.observe_routing(stream, experience.current_experience, counts, trained_on)

    def _log_matrix(self) -> None:
        """The accuracy matrix (table and heatmap), forgetting and routing, if they changed since last logged."""
        if not self._matrix_changed or self._run is None:
            return
        self._log(matrix_values(self.wandb, self.accuracy_matrix, forgetting=not self._avalanche_forgetting))
        self._matrix_changed = False
        self._results_logged = False

    def _log_results(self) -> None:
        """The final results table of every stream."""
        values = results_values(self.wandb, self.accuracy_matrix)
        if values:
            self._log(values)
        self._results_logged = True

    def _finish_report(self) -> None:
        if self._run is None or self._report_finished_for is self._run:
            return  # nothing to log into, or done already (close() and then __exit__)
        self._log_matrix()
        if not self._results_logged:
            self._log_results()
        if self.skipped_non_finite:
            self._run.summary["skipped_non_finite"] = sorted(self.skipped_non_finite)
        self._report_finished_for = self._run
