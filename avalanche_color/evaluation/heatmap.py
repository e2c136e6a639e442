"""The accuracy matrix drawn as a heatmap (a matplotlib figure, without pyplot's global state)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure


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
