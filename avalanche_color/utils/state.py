"""State that grows with the stream: buffers whose shapes a stored ``state_dict`` decides."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn


def take_stored_shapes(module: nn.Module, state_dict: dict[str, Any], prefix: str, names: Iterable[str]) -> None:
    """Give each named buffer of ``module`` the shape and dtype it has in ``state_dict``, before loading.

    For buffers that grow with the stream (prototypes, routing statistics): loading a later
    state into a fresh module then fills them instead of failing on the shape.
    """
    for name in names:
        stored = state_dict.get(prefix + name)
        if stored is not None:
            setattr(module, name, torch.empty_like(stored, device=getattr(module, name).device))
