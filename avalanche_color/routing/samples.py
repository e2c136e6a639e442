"""The check every closed-form classifier of the class routers makes of the samples it is given."""

from __future__ import annotations

from torch import Tensor


def check_samples(features: Tensor, targets: Tensor) -> None:
    """Refuse features and targets of different or zero length, and negative targets."""
    if features.shape[0] != targets.shape[0] or features.shape[0] == 0:
        raise ValueError(f"features and targets must have the same, non-zero length, got "
                         f"{features.shape[0]} and {targets.shape[0]}")
    if int(targets.min()) < 0:
        raise ValueError(f"targets must be non-negative, got {int(targets.min())}")
