"""Oracle routing: each sample goes to the newest expert trained on its task label.

Task-incremental evaluation (the paper's "oracle" rows): the router reads the task labels, not
features, so no routing pass through the backbone is made. It learns nothing: the experts'
task labels are the expert bank's record, given with each batch.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from avalanche_color.routing.router import Clustering, Router


class OracleRouter(Router):
    """Routes each sample to the newest expert whose task label is the sample's."""

    uses_features = False

    def fit(self, expert: int, features: Tensor, labels: Tensor, *, clustering: Optional[Clustering] = None) -> None:
        """Nothing to learn: an expert is found by the task label it was trained on."""

    def knows(self, expert: int) -> bool:
        return True

    def forward(self, features: Optional[Tensor], task_labels: Optional[Tensor] = None,
                expert_tasks: Optional[Tensor] = None) -> Tensor:
        """The newest expert trained on each sample's task label (a revisited task: its newest expert)."""
        if task_labels is None or expert_tasks is None:
            raise ValueError("router='oracle' routes by task label: it needs task_labels, one per sample")
        tasks = expert_tasks.tolist()
        unknown = set(task_labels.unique().tolist()) - set(tasks)
        if unknown:
            raise ValueError(f"task labels {sorted(unknown)} have no expert; known: {sorted(set(tasks))}")
        lookup = torch.full((max(tasks) + 1,), -1, dtype=torch.long, device=task_labels.device)
        for expert, task in enumerate(tasks):
            lookup[task] = expert
        return lookup[task_labels.long()]
