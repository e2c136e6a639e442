"""One linear head per expert, over the classes of its experience."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn


def check_classes(classes: Sequence[int]) -> None:
    """Refuse an empty class list or negative class ids."""
    if len(classes) == 0:
        raise ValueError("classes must name at least one class, got an empty sequence")
    if min(classes) < 0:
        raise ValueError(f"classes must be non-negative class ids, got {sorted(classes)}")


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
