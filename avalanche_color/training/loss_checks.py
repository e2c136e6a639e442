"""The training loss's checks: read at once (check_finite_loss), or watched on its device and read every N steps.

When each is used (the trade-off of a host sync): :mod:`avalanche_color.training.data_checks`.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

# On a GPU the loss is read on the host every this many training steps (see data_checks' module docstring).
GPU_LOSS_CHECK_EVERY = 50


def check_finite_loss(loss: Tensor, where: str, labels: Optional[Tensor] = None,
                      head_classes: Optional[Tensor] = None) -> None:
    """Stop training on a NaN or infinite loss, before it reaches any weight.

    With the batch's ``labels`` and the classes of the head being trained, a
    batch holding labels outside the head (its logits there are -inf) is named as the cause.
    """
    if bool(torch.isfinite(loss).all()):
        return
    outside = []
    if labels is not None and head_classes is not None:
        outside = sorted(set(labels.unique().tolist()) - set(head_classes.tolist()))
    if outside:
        cause = (f"the batch holds labels {outside} outside the classes {head_classes.tolist()} of the expert being "
                 f"trained, whose logits there are -inf. Each expert learns its own experience's classes only: "
                 f"something added samples of other experiences to this one (a replay or memory plugin, or a "
                 f"custom loader); train on each experience's own data")
    else:
        cause = "lower the learning rate or check the data"
    raise FloatingPointError(
        f"the training loss became {loss.detach().flatten().tolist()[:4]} at {where}; stopped before "
        f"the backward pass, so no weight took this step. Earlier experts and prototypes are unchanged; "
        f"this experience's expert is unfinished. Likely cause: {cause}; then resume from the last checkpoint"
    )


class DeferredLossCheck:
    """The training loss's finiteness, watched on its device and read on the host every ``every`` steps.

    :meth:`add` keeps, on the loss's device, the index of the first step whose loss was not finite
    (no host sync) and, on the host, where each step was; :meth:`check` reads that index (one
    sync) and raises a ``FloatingPointError`` naming where the first bad step was.
    """

    def __init__(self, every: int) -> None:
        if not (isinstance(every, int) and every >= 1):
            raise ValueError(f"every must be an integer >= 1, got {every!r}")
        self.every = every
        self.first_bad: Optional[Tensor] = None
        self.places: list[str] = []

    def add(self, loss: Tensor, where: str) -> Tensor:
        """Watch this step's loss; returns whether it is not finite, as a 0-d bool tensor on its device."""
        bad = ~torch.isfinite(loss.detach()).all()
        if self.first_bad is None:
            self.first_bad = torch.full((), -1, dtype=torch.long, device=loss.device)
        self.first_bad = torch.where(bad & (self.first_bad < 0), len(self.places), self.first_bad)
        self.places.append(where)
        return bad

    @property
    def due(self) -> bool:
        return len(self.places) >= self.every

    def check(self) -> None:
        """Raise if a step since the last check had a non-finite loss; then start over."""
        if not self.places or self.first_bad is None:
            return
        first, places = int(self.first_bad), self.places  # the one host sync
        self.first_bad, self.places = None, []
        if first >= 0:
            raise FloatingPointError(
                f"the training loss became non-finite at {places[first]}; read {len(places) - first - 1} steps "
                f"later (it is read every {self.every} steps on a GPU: a read stalls the GPU), and those steps' "
                f"gradients were zeroed, so no NaN or inf reached a weight. Earlier experts and prototypes are "
                f"unchanged; this experience's expert is unfinished. Likely cause: lower the learning rate or "
                f"check the data (loss_check_every=1 stops at the bad step itself); then resume from the last "
                f"checkpoint")
