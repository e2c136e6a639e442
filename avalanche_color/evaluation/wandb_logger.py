"""A Weights & Biases logger for Avalanche 0.6.0 that works with current wandb.

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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional

import numpy as np
from avalanche.evaluation.metric_results import AlternativeValues, TensorImage
from avalanche.logging import WandBLogger as AvalancheWandBLogger
from PIL.Image import Image
from torch import Tensor

if TYPE_CHECKING:
    from types import ModuleType, TracebackType

    from avalanche.evaluation.metric_results import MetricValue
    from avalanche.training.templates import SupervisedTemplate
    from wandb import Run

# (module, class) of wandb's chart objects, current names first; ``viz`` is wandb < 0.19.
_CHART_CLASSES = (("plot", "CustomChart"), ("plot", "Visualize"), ("viz", "CustomChart"), ("viz", "Visualize"))


def _chart_types(wandb: "ModuleType") -> tuple[type, ...]:
    """The classes of chart values (``wandb.plot.confusion_matrix`` etc.) this wandb has."""
    found: list[type] = []
    for module_name, class_name in _CHART_CLASSES:
        cls = getattr(getattr(wandb, module_name, None), class_name, None)
        if isinstance(cls, type) and cls not in found:
            found.append(cls)
    return tuple(found)


class WandBLogger(AvalancheWandBLogger):
    """Avalanche's W&B logger, fixed for current wandb (no ``wandb.viz``, ``wandb.util.generate_id``).

    It takes the same arguments as :class:`avalanche.logging.WandBLogger` (``project_name``,
    ``run_name``, ``log_artifacts``, ``path``, ``uri``, ``sync_tfboard``, ``save_code``,
    ``config``, ``dir`` and ``params``, the extra ``wandb.init`` arguments) and logs the
    same values: numbers, images, tensors (as histograms), matplotlib figures and W&B
    charts such as :class:`~avalanche.evaluation.metrics.WandBStreamConfusionMatrix`'s,
    each at the step Avalanche gives it. It works offline (``WANDB_MODE=offline``).

    Which run it logs to:

    - If no W&B run is active, the logger starts one with ``wandb.init`` and owns it:
      :meth:`close` (or leaving a ``with`` block) finishes it. Avalanche has no "end of
      all training" event (``after_training`` fires after every ``train`` call), so the
      run stays open until then; wandb finishes unfinished runs at interpreter exit.
    - If a run is already active (the caller's ``wandb.init``, a sweep agent's run), the
      logger logs into it and never finishes it; that run keeps its own project, name and
      config, and the logger's are not applied. That includes a run an earlier logger
      left open, so close loggers you are done with. Pass
      ``params={"reinit": "create_new"}`` to start a separate run instead (owned by the
      logger as above).

    The run is :attr:`run`; put end-of-run values in ``logger.run.summary`` before
    :meth:`close`.
    """

    _run: Optional["Run"] = None
    _owns_run: bool = False

    @property
    def run(self) -> Optional["Run"]:
        """The W&B run this logger logs to."""
        return self._run

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

    def after_training_exp(
        self, strategy: "SupervisedTemplate", metric_values: List["MetricValue"], **kwargs: Any
    ) -> None:
        self.log_metrics(metric_values)
        self._log({"TrainingExperience": self.exp_count})
        self.exp_count += 1

    def log_single_metric(self, name: str, value: Any, x_plot: int) -> None:
        self.step = x_plot
        if name.startswith("WeightCheckpoint"):
            if self.log_artifacts:
                self._log_checkpoint(name, value, x_plot)
            return
        from matplotlib.figure import Figure  # here: matplotlib is needed only once a metric is logged

        charts = _chart_types(self.wandb)
        if isinstance(value, AlternativeValues):
            value = value.best_supported_value(Image, Tensor, TensorImage, Figure, float, int, *charts)
        if isinstance(value, Image):
            self._log({name: self.wandb.Image(value)})
        elif isinstance(value, TensorImage):
            self._log({name: self.wandb.Image(value.image.detach().cpu().numpy())})
        elif isinstance(value, Tensor):
            histogram = np.histogram(value.detach().cpu().reshape(-1).numpy())
            self._log({name: self.wandb.Histogram(np_histogram=histogram)})
        elif isinstance(value, (float, int, Figure, *charts)):
            self._log({name: value})
        # Anything else (strings, None, ...) is skipped, as by Avalanche's logger.

    def close(self) -> None:
        """Finish the run if this logger started it (a no-op when it is already finished)."""
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
        if self._run is not None and self._owns_run:
            self._run.finish(exit_code=0 if exc is None else 1)

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state.pop("_run", None)
        state.pop("_owns_run", None)
        return state

    def _log(self, values: dict) -> None:
        if self._run is None:
            raise RuntimeError("WandBLogger has no W&B run: before_run() did not complete")
        self._run.log(values, step=self.step)


__all__ = ["WandBLogger"]
