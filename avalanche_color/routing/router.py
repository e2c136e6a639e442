"""Nearest-prototype routing: every expert's prototypes, and the choice of expert per sample."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from avalanche_color.config import DISTANCES, Distance, check_choice
from avalanche_color.utils.state import take_stored_shapes


def pairwise_distance(x: Tensor, y: Tensor, distance: Distance) -> Tensor:
    """(n, m) distances between the rows of x (n, d) and of y (m, d)."""
    if distance == "euclidean":
        return torch.cdist(x, y, p=2.0)
    if distance == "l1":
        return torch.cdist(x, y, p=1.0)
    if distance == "cosine":
        return 1 - nn.functional.normalize(x, dim=-1) @ nn.functional.normalize(y, dim=-1).T
    raise ValueError(f"distance must be one of {DISTANCES}, got {distance!r}")


class PrototypeRouter(nn.Module):
    """Every expert's prototypes, and the nearest-prototype choice of expert.

    The prototypes and their owners are buffers, so they travel in the
    ``state_dict``; loading a state with more prototypes resizes them.

    Args:
        distance: how far a feature is from a prototype.
    """

    prototypes: Tensor
    owners: Tensor

    def __init__(self, distance: Distance = "euclidean") -> None:
        super().__init__()
        check_choice("distance", distance, DISTANCES)
        self.distance: Distance = distance
        self.register_buffer("prototypes", torch.empty(0, 0))
        self.register_buffer("owners", torch.empty(0, dtype=torch.long))

    @property
    def num_experts(self) -> int:
        """How many experts own prototypes (one past the largest owner id)."""
        return int(self.owners.max()) + 1 if self.owners.numel() else 0

    def set_prototypes(self, expert: int, centres: Tensor) -> None:
        """Give ``expert`` the prototypes ``centres`` (k, d), replacing any it had."""
        centres = centres.detach().to(self.prototypes.device, torch.float32)
        if self.prototypes.numel() and centres.shape[1] != self.prototypes.shape[1]:
            raise ValueError(
                f"centres must have width {self.prototypes.shape[1]} like the stored "
                f"prototypes, got {centres.shape[1]}"
            )
        keep = self.owners != expert
        owners = torch.full((len(centres),), expert, dtype=torch.long, device=self.owners.device)
        old = self.prototypes[keep] if self.prototypes.numel() else centres[:0]
        self.prototypes = torch.cat((old, centres))
        self.owners = torch.cat((self.owners[keep], owners))

    def forward(self, features: Tensor) -> Tensor:
        """The expert of each feature row's nearest prototype, shape (n,)."""
        if not self.owners.numel():
            raise RuntimeError("no prototypes yet: the router is fitted after the first experience")
        distances = pairwise_distance(features.float(), self.prototypes, self.distance)
        return self.owners[distances.argmin(dim=1)]

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        take_stored_shapes(self, state_dict, prefix, ("prototypes", "owners"))  # they grow with the stream
        super()._load_from_state_dict(state_dict, prefix, *args)
