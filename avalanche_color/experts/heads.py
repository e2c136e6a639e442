"""One linear head per expert, over the classes of its experience."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn


class ExpertHead(nn.Module):
    """A linear head over the classes of one experience.

    ``classes`` maps the head's outputs to the global class ids.
    """

    classes: Tensor

    def __init__(self, in_features: int, classes: Sequence[int]) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, len(classes))
        self.register_buffer("classes", torch.as_tensor(sorted(classes), dtype=torch.long))

    def forward(self, features: Tensor) -> Tensor:
        return self.linear(features)
