"""What :class:`~avalanche_color.evaluation.wandb_logger.WandBLogger` puts in a W&B run: each metric
value as a W&B object, the strategy's options for the run's config, and the tables and heatmap
built from the :class:`~avalanche_color.evaluation.accuracy_matrix.AccuracyMatrix`.

The functions take the ``wandb`` module the logger imported, so that importing this module
imports no wandb.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from avalanche.evaluation.metric_results import AlternativeValues, TensorImage
from PIL.Image import Image
from torch import Tensor

from avalanche_color.evaluation.accuracy_matrix import AccuracyMatrix
from avalanche_color.evaluation.heatmap import accuracy_heatmap

if TYPE_CHECKING:
    from types import ModuleType

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
