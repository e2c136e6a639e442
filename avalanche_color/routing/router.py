"""The router interface, and CoLoR's router: the nearest prototype.

A :class:`Router` follows the experts' life cycle: it is *fitted* for an expert from that
expert's experience (its routing features and class labels), may be fitted again while the
expert trains, is told when the expert is *finished*, and *routes* a batch: one expert index
per sample. Every router keeps what it learned in its ``state_dict``.

Every router computes in float32 or float64 under any ``torch.autocast``
(:func:`~avalanche_color.utils.precision.full_precision`).

* :class:`PrototypeRouter` (here): k-means centres of each experience's features; the
  nearest centre's expert (the paper).
* :class:`~avalanche_color.routing.class_router.ClassRouter`: a classifier over
  (expert, class) pairs (ridge or Gaussian; beyond the paper).
* :class:`~avalanche_color.routing.oracle.OracleRouter`: the expert of the sample's task label.

:func:`~avalanche_color.routing.routers.make_router` builds the one the options name.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Optional

import torch
from torch import Tensor, nn

from avalanche_color.config import DISTANCES, Distance
from avalanche_color.routing.prototypes import kmeans_clustering
from avalanche_color.utils.checks import one_of, require
from avalanche_color.utils.precision import in_full_precision
from avalanche_color.utils.state import take_stored_shapes

# (features (n, d), class labels (n,)) -> prototypes (m, d): how an experience becomes prototypes.
Clustering = Callable[[Tensor, Tensor], Tensor]


class Router(nn.Module):
    """Picks an expert for each sample. Subclasses implement :meth:`fit`, :meth:`knows` and :meth:`forward`.

    Attributes:
        uses_features: whether routing reads routing features (the oracle reads task labels only,
            so no backbone pass is made for it).
    """

    uses_features: ClassVar[bool] = True

    def fit(self, expert: int, features: Tensor, labels: Tensor, *, clustering: Optional[Clustering] = None) -> None:
        """Learn ``expert`` from its experience's routing features (n, d) and class labels (n,),
        replacing what an earlier fit of ``expert`` learned. ``clustering``: how prototypes are made
        (routers without prototypes ignore it)."""
        raise NotImplementedError

    def finish(self, expert: int) -> None:
        """``expert``'s experience is over: no later fit of it will come."""

    def knows(self, expert: int) -> bool:
        """Whether ``expert`` can be routed to (it was fitted)."""
        raise NotImplementedError

    def forward(self, features: Optional[Tensor], task_labels: Optional[Tensor] = None,
                expert_tasks: Optional[Tensor] = None) -> Tensor:
        """The expert index of each sample, shape (n,).

        Args:
            features: (n, d) routing features (None for a router that does not use them).
            task_labels: (n,) task labels, for the oracle.
            expert_tasks: each expert's task label (the expert bank's record), for the oracle.
        """
        raise NotImplementedError


class PrototypeRouter(Router):
    """Every expert's prototypes, and the nearest-prototype choice of expert.

    The prototypes and their owners are buffers, so they travel in the
    ``state_dict``; loading a state with more prototypes resizes them.

    Args:
        distance: how far a feature is from a prototype: ``"euclidean"``, ``"l1"`` or ``"cosine"``.
    """

    prototypes: Tensor
    owners: Tensor

    def __init__(self, distance: Distance = "euclidean") -> None:
        super().__init__()
        require("distance", distance, one_of(DISTANCES))
        self.distance: Distance = distance
        self.register_buffer("prototypes", torch.empty(0, 0))
        self.register_buffer("owners", torch.empty(0, dtype=torch.long))

    @property
    def num_experts(self) -> int:
        """How many experts own prototypes (one past the largest owner id)."""
        return int(self.owners.max()) + 1 if self.owners.numel() else 0

    def fit(self, expert: int, features: Tensor, labels: Tensor, *, clustering: Optional[Clustering] = None) -> None:
        """``expert``'s prototypes: ``clustering(features, labels)`` (default: 5 k-means centres, seed 0)."""
        self.set_prototypes(expert, (clustering or kmeans_clustering())(features, labels))

    def knows(self, expert: int) -> bool:
        return bool((self.owners == expert).any())

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

    @in_full_precision
    def forward(self, features: Optional[Tensor], task_labels: Optional[Tensor] = None,
                expert_tasks: Optional[Tensor] = None) -> Tensor:
        """The expert of each feature row's nearest prototype, shape (n,); the distances in float32
        under any autocast (bfloat16 distances would change the nearest prototype of some samples)."""
        if not self.owners.numel():
            raise RuntimeError("no prototypes yet: the router is fitted after the first experience")
        if features is None:
            raise ValueError("the prototype router routes by features: give the routing features")
        features = features.float()
        if self.distance == "cosine":
            normalize = nn.functional.normalize
            distances = 1 - normalize(features, dim=-1) @ normalize(self.prototypes, dim=-1).T
        else:
            distances = torch.cdist(features, self.prototypes, p=2.0 if self.distance == "euclidean" else 1.0)
        return self.owners[distances.argmin(dim=1)]

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        take_stored_shapes(self, state_dict, prefix, ("prototypes", "owners"))  # they grow with the stream
        super()._load_from_state_dict(state_dict, prefix, *args)
