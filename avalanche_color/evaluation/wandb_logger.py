"""A Weights & Biases logger for Avalanche 0.6.0 that works with current wandb, and what it puts in a run.

Avalanche 0.6.0's :class:`avalanche.logging.WandBLogger` was written against the wandb
API of 2023. With current wandb (checked against 0.31.0) it breaks in two places:

- ``before_run`` creates the run id with ``wandb.util.generate_id()``, which wandb 0.28
  removed, so constructing the logger raises ``AttributeError`` (unless an id is given).
- ``log_single_metric`` names ``wandb.viz.CustomChart`` when it sorts metric values, so
  logging any metric, even a float, raises ``AttributeError``. The ``wandb.viz`` module
  has been gone since wandb 0.19 (Avalanche issue #1674): charts are now
  ``wandb.plot.CustomChart`` objects, which ``wandb.plot.confusion_matrix``,
  ``wandb.plot.line``, ... and ``wandb.plot_table`` return.

It also calls the private ``wandb.run._label(repo="Avalanche")``, which only tags W&B's
usage telemetry.

:class:`WandBLogger` here subclasses Avalanche's logger and changes only what is broken:
wandb creates the run id itself (``wandb.init`` also reads ``WANDB_RUN_ID``), and the
logger remembers ``run.id`` in ``init_kwargs`` so a logger restored from a checkpoint
resumes the same run. Charts are recognised as ``wandb.plot.CustomChart`` /
``wandb.plot.Visualize`` (or the old ``wandb.viz`` classes on a wandb that has them). The
private ``_label`` call is dropped. Metrics go to the logger's own run, at Avalanche's
step (``MetricValue.x_plot``, the strategy's training-iteration count), and
:meth:`WandBLogger.close` finishes the run if the logger started it.

Beyond Avalanche's logger, a run also holds the strategy's options in its config, the
accuracy matrix (a table and a heatmap), forgetting, how test samples were routed, and a
final results table; non-finite values are left out (see :class:`WandBLogger`). The functions
before the logger make those values: each metric value as a W&B object (:func:`wandb_value`), the
strategy's options for the run's config (:func:`strategy_options`), and the tables and heatmap built
from the :class:`~avalanche_color.evaluation.metrics.AccuracyMatrix`. They take the ``wandb`` module the
logger imported.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, List, Optional, Sequence

import numpy as np
from avalanche.evaluation.metric_results import AlternativeValues, TensorImage
from avalanche.logging import WandBLogger as AvalancheWandBLogger
from PIL.Image import Image
from torch import Tensor

from avalanche_color.evaluation.metrics import AccuracyMatrix, RoutingAccuracy

if TYPE_CHECKING:
    from types import ModuleType, TracebackType

    from avalanche.evaluation.metric_results import MetricValue
    from avalanche.training.templates import SupervisedTemplate
    from matplotlib.figure import Figure
    from wandb import Run


# ---------------------------------------------------------------------- the values it logs

# (module, class) of wandb's chart objects, current names first; ``viz`` is wandb < 0.19.
_CHART_CLASSES = (("plot", "CustomChart"), ("plot", "Visualize"), ("viz", "CustomChart"), ("viz", "Visualize"))


def chart_types(wandb: "ModuleType") -> tuple[type, ...]:
    """The classes of chart values (``wandb.plot.confusion_matrix`` etc.) this wandb has."""
    found: list[type] = []
    for module_name, class_name in _CHART_CLASSES:
        cls = getattr(getattr(wandb, module_name, None), class_name, None)
        if isinstance(cls, type) and cls not in found:
            found.append(cls)
    return tuple(found)


def wandb_value(wandb: "ModuleType", value: Any) -> Any:
    """An Avalanche metric value as W&B logs it, or None for what is not logged (strings, None, ...).

    Of :class:`AlternativeValues`, the best this wandb supports; images and Avalanche's
    ``TensorImage`` as ``wandb.Image``, other tensors as histograms; numbers, matplotlib figures
    and W&B charts as they are.
    """
    from matplotlib.figure import Figure  # here: matplotlib is needed only once a metric is logged

    charts = chart_types(wandb)
    if isinstance(value, AlternativeValues):
        value = value.best_supported_value(Image, Tensor, TensorImage, Figure, float, int, *charts)
    if isinstance(value, Image):
        return wandb.Image(value)
    if isinstance(value, TensorImage):
        return wandb.Image(value.image.detach().cpu().numpy())
    if isinstance(value, Tensor):
        return wandb.Histogram(np_histogram=np.histogram(value.detach().cpu().reshape(-1).numpy()))
    return value if isinstance(value, (float, int, Figure, *charts)) else None


def strategy_options(strategy: Any) -> dict[str, Any]:
    """What a run's config records of a strategy: its class name and options.

    A package strategy's options are its ``config`` (every field); for another Avalanche
    strategy, its batch sizes and epochs.
    """
    options: dict[str, Any] = {"strategy": type(strategy).__name__}
    as_dict = getattr(getattr(strategy, "config", None), "as_dict", None)
    if callable(as_dict):
        options.update(as_dict())
    else:
        options.update({name: getattr(strategy, name) for name in ("train_mb_size", "train_epochs", "eval_mb_size")
                        if isinstance(getattr(strategy, name, None), int)})
    return options


def matrix_values(wandb: "ModuleType", matrix: AccuracyMatrix, forgetting: bool = True) -> dict[str, Any]:
    """Per evaluation stream: the accuracy matrix as a table and a heatmap, forgetting per experience
    and its mean (unless ``forgetting`` is False: Avalanche's forgetting metrics log them already), and the
    routing table (which expert answered how many samples of each test experience)."""
    values: dict[str, Any] = {}
    rows = [f"exp {experience}" for experience in matrix.trained]
    for stream in matrix.streams():
        columns = [f"exp {column}" for column in matrix.columns(stream)]
        cells = matrix.matrix(stream)
        values[f"AccuracyMatrix/{stream}"] = wandb.Table(
            columns=["after training", *columns], data=[[row, *cell] for row, cell in zip(rows, cells)])
        figure = accuracy_heatmap(cells, rows, columns, title=f"accuracy on {stream}")
        values[f"AccuracyHeatmap/{stream}"] = wandb.Image(figure)
        forgotten = matrix.forgetting(stream) if forgetting else {}
        values.update({f"Forgetting_Exp/{stream}/Exp{column:03d}": value for column, value in forgotten.items()})
        if forgotten:
            values[f"Forgetting_Stream/{stream}"] = sum(forgotten.values()) / len(forgotten)
    for stream, routed in sorted(matrix.routing.items()):
        data = [[experience, routing.accuracy, expert, routing.expert_experiences[expert], samples,
                 samples / sum(routing.experts.values())]
                for experience, routing in sorted(routed.items()) for expert, samples in routing.experts.items()]
        if data:
            values[f"Routing/{stream}"] = wandb.Table(
                columns=["test experience", "routing accuracy", "expert", "expert's training experience",
                         "samples", "share"], data=data)
    return values


def results_values(wandb: "ModuleType", matrix: AccuracyMatrix) -> dict[str, Any]:
    """The final results table of every stream that has rows (accuracy, forgetting, routing per test experience)."""
    values = {}
    for stream in matrix.streams():
        rows = matrix.final_rows(stream)
        if rows:
            values[f"Results/{stream}"] = wandb.Table(columns=list(rows[0]), data=[list(row.values()) for row in rows])
    return values


def accuracy_heatmap(matrix: Sequence[Sequence[Optional[float]]], rows: Sequence[str], columns: Sequence[str],
                     title: str) -> "Figure":
    """Accuracies in [0, 1] as coloured cells with their values written in; empty where None."""
    from matplotlib.figure import Figure  # here: matplotlib is needed only when a heatmap is drawn

    values = np.array([[np.nan if v is None else v for v in row] for row in matrix], dtype=float).reshape(
        len(rows), len(columns))
    figure = Figure(figsize=(1.2 + 0.6 * len(columns), 1.0 + 0.45 * len(rows)), layout="constrained")
    axes = figure.subplots()
    image = axes.imshow(values, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    axes.set_xticks(range(len(columns)), labels=columns)
    axes.set_yticks(range(len(rows)), labels=rows)
    axes.set_xlabel("test experience")
    axes.set_ylabel("after training")
    axes.set_title(title)
    for (row, column), value in np.ndenumerate(values):
        if not np.isnan(value):
            axes.text(column, row, f"{value:.2f}", ha="center", va="center", fontsize=8,
                      color="black" if value > 0.6 else "white")
    figure.colorbar(image, ax=axes, label="accuracy")
    return figure


# ---------------------------------------------------------------------- the logger

# The names of Avalanche's forgetting metrics (forgetting_metrics): the same values as Forgetting_*.
AVALANCHE_FORGETTING = ("ExperienceForgetting/", "StreamForgetting/")


class WandBLogger(AvalancheWandBLogger):
    """Avalanche's W&B logger, fixed for current wandb (no ``wandb.viz``, ``wandb.util.generate_id``).

    It takes the same arguments as :class:`avalanche.logging.WandBLogger` (``project_name``,
    ``run_name``, ``log_artifacts``, ``path``, ``uri``, ``sync_tfboard``, ``save_code``,
    ``config``, ``dir`` and ``params``, the extra ``wandb.init`` arguments) and logs the
    same values: numbers, images, tensors (as histograms), matplotlib figures and W&B
    charts such as :class:`~avalanche.evaluation.metrics.WandBStreamConfusionMatrix`'s,
    each at the step Avalanche gives it. It works offline (``WANDB_MODE=offline``).

    What it adds to the run:

    - **config**: the strategy's options, read when training starts: every field of a package
      strategy's ``strategy.config`` (``rank``, ``k``, ...), or an Avalanche strategy's batch
      sizes and epochs, and ``strategy`` (its class name). Keys the run's config already has
      (the logger's ``config=``, the caller's) keep their values.
    - after each evaluation, per evaluation stream (``<stream>`` is e.g. ``test_stream``):
      ``AccuracyMatrix/<stream>``, a table of accuracies by training experience done (rows)
      and test experience (columns), and ``AccuracyHeatmap/<stream>``, the same as an image;
      ``Forgetting_Exp/<stream>/ExpNNN`` (accuracy just after the experience's own training
      minus accuracy now) and ``Forgetting_Stream/<stream>`` (their mean), unless the evaluator
      has Avalanche's ``forgetting_metrics``, whose ``ExperienceForgetting`` and
      ``StreamForgetting`` panels show the same values (then only those are logged); with
      :func:`~avalanche_color.evaluation.metrics.routing_accuracy_metrics`,
      ``Routing/<stream>``, a table of which expert answered how many samples of each test
      experience, with the experience the expert was trained on.
    - ``Results/<stream>``: a table with one row per test experience (accuracy, forgetting,
      routing accuracy, experts), after an evaluation once the stream's last training
      experience is done, and at :meth:`close`.

    The matrix needs the per-experience accuracies (``accuracy_metrics(experience=True)``);
    an evaluation during training (Avalanche's ``eval_every``) fills the current row until a
    later one replaces it. Tables and the heatmap are logged after evaluations outside
    training and after each training experience, at the step of the last metric.

    **Non-finite values are not logged.** A routed model gives ``-inf`` logits to the classes
    its chosen expert does not have, so a sample routed to a wrong expert has an infinite
    cross-entropy, and so do ``Loss_Exp`` and ``Loss_Stream`` in evaluation: the loss is
    undefined there and W&B would keep ``Infinity`` in the summary. Such values (and NaNs) are
    skipped; their names are listed in the summary as ``skipped_non_finite``. The training
    loss, where the expert in training answers every sample, is finite and logged. The
    logger prints nothing, so it never breaks a progress bar.

    Which run it logs to:

    - If no W&B run is active, the logger starts one with ``wandb.init`` and owns it:
      :meth:`close` (or leaving a ``with`` block) finishes it. Avalanche has no "end of
      all training" event (``after_training`` fires after every ``train`` call), so the
      run stays open until then; wandb finishes unfinished runs at interpreter exit.
    - If a run is already active (the caller's ``wandb.init``, a sweep agent's run), the
      logger logs into it and never finishes it; that run keeps its own project, name and
      config, and the logger's are not applied (the strategy's options are added where the
      run's config lacks them). That includes a run an earlier logger left open, so close
      loggers you are done with. Pass ``params={"reinit": "create_new"}`` to start a
      separate run instead (owned by the logger as above).

    The run is :attr:`run`; put end-of-run values in ``logger.run.summary`` before
    :meth:`close`.
    """

    # Defaults for the state below: Avalanche's __init__ starts the run before a subclass could set them.
    _run: Optional["Run"] = None
    _owns_run: bool = False
    _training: bool = False  # between before_training and after_training
    _options_recorded: bool = False
    _stream_length: Optional[int] = None  # of the training stream, to know its last experience
    _matrix_changed: bool = False  # since the matrix was last logged
    _results_logged: bool = True  # since the matrix last changed
    _report_finished_for: Optional["Run"] = None
    _avalanche_forgetting: bool = False  # Avalanche's forgetting metrics logged: no Forgetting_* panels of our own

    @property
    def run(self) -> Optional["Run"]:
        """The W&B run this logger logs to."""
        return self._run

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

    def before_run(self) -> None:
        """Start the W&B run (or join the active one) and remember its id for resuming."""
        if self.wandb is None:
            self.import_wandb()
        if self.init_kwargs is None:
            self.init_kwargs = {}
        kwargs = {key: value for key, value in self.init_kwargs.items() if not (key == "id" and value is None)}
        active = self.wandb.run
        run = active if active is not None and "reinit" not in kwargs else self.wandb.init(**kwargs)
        self._run = run
        self._owns_run = run is not active
        self.init_kwargs["id"] = run.id

    def before_training(self, strategy: "SupervisedTemplate", metric_values: List["MetricValue"],
                        **kwargs: Any) -> None:
        """Put the strategy's options into the run's config (once; keys already there are kept)."""
        self._training = True
        if self._run is None or self._options_recorded:
            return
        options = {key: value for key, value in strategy_options(strategy).items() if key not in self._run.config}
        self._run.config.update(options, allow_val_change=True)
        self._options_recorded = True

    def after_training(self, strategy: "SupervisedTemplate", metric_values: List["MetricValue"],
                       **kwargs: Any) -> None:
        self._training = False

    def before_training_exp(self, strategy: "SupervisedTemplate", metric_values: List["MetricValue"],
                            **kwargs: Any) -> None:
        self._training = True  # also when train() was called before this logger saw before_training
        self.accuracy_matrix.start_training(int(strategy.experience.current_experience))
        stream = getattr(strategy.experience, "origin_stream", None)
        self._stream_length = len(stream) if stream is not None else None

    def after_training_exp(
        self, strategy: "SupervisedTemplate", metric_values: List["MetricValue"], **kwargs: Any
    ) -> None:
        self.log_metrics(metric_values)
        self._log({"TrainingExperience": self.exp_count})
        self.exp_count += 1
        self._log_matrix()  # rows an evaluation during training filled

    def after_eval(self, strategy: "SupervisedTemplate", metric_values: List["MetricValue"], **kwargs: Any) -> None:
        if self._training:
            return  # a periodic evaluation; the row is logged after the training experience
        self._log_matrix()
        matrix = self.accuracy_matrix
        if self._stream_length is not None and matrix.trained and matrix.trained[-1] == self._stream_length - 1:
            self._log_results()

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

    def log_single_metric(self, name: str, value: Any, x_plot: int) -> None:
        self.step = x_plot
        if name.startswith("WeightCheckpoint"):
            if self.log_artifacts:
                self._log_checkpoint(name, value, x_plot)
            return
        value = wandb_value(self.wandb, value)
        if value is None:
            return  # strings, None, ...: skipped, as by Avalanche's logger
        if isinstance(value, float) and not math.isfinite(value):
            self.skipped_non_finite.add(name)  # see the class docstring
            return
        if isinstance(value, (float, int)) and not isinstance(value, bool):
            self._matrix_changed |= self.accuracy_matrix.observe(name, value)
        if name.startswith(AVALANCHE_FORGETTING):
            self._avalanche_forgetting = True
        self._log({name: value})

    def close(self) -> None:
        """Log the final results table, then finish the run if this logger started it."""
        self._finish_report()
        if self._run is not None and self._owns_run:
            self._run.finish()

    def __enter__(self) -> "WandBLogger":
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional["TracebackType"],
    ) -> None:
        if exc is None:
            self._finish_report()
        if self._run is not None and self._owns_run:
            self._run.finish(exit_code=0 if exc is None else 1)

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state.pop("_run", None)
        state.pop("_owns_run", None)
        state.pop("_report_finished_for", None)
        return state

    def _log(self, values: dict) -> None:
        if self._run is None:
            raise RuntimeError("WandBLogger has no W&B run: before_run() did not complete")
        self._run.log(values, step=self.step)

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


__all__ = ["WandBLogger"]
