"""The routers: which expert answers each sample, behind one interface.

A :class:`Router` follows the experts' life cycle: it is *fitted* for an expert from that
expert's experience (its routing features and class labels), may be fitted again while the
expert trains, is told when the expert is *finished*, and *routes* a batch: one expert index
per sample. Every router keeps what it learned in its ``state_dict``.

Every router computes in float32 or float64 under any ``torch.autocast``
(:func:`~avalanche_color.routing.classifiers.full_precision`).

* :class:`PrototypeRouter`: k-means centres of each experience's features (:func:`fit_prototypes`); the
  nearest centre's expert (the paper).
* :class:`OracleRouter`: the expert of the sample's task label.
* :class:`ClassRouter`: a classifier over (expert, class) pairs (ridge or Gaussian, from
  :mod:`avalanche_color.routing.classifiers`; beyond the paper).

:func:`make_router` builds the one the options name.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Literal, Optional, Union

import numpy as np
import torch
from torch import Tensor, nn

from avalanche_color.config import DISTANCES, Distance, RoutingOptions
from avalanche_color.routing.classifiers import GaussianClassifier, RandomFeatureRidge
from avalanche_color.utils.checks import one_of, require
from avalanche_color.utils.precision import in_full_precision
from avalanche_color.utils.state import take_stored_shapes

# (features (n, d), class labels (n,)) -> prototypes (m, d): how an experience becomes prototypes.
Clustering = Callable[[Tensor, Tensor], Tensor]


# --------------------------------------------------------------------------------------------------
# Prototypes: the k-means centres of one experience's features, fitted after training on it.

def fit_prototypes(features: Tensor, k: int, *, seed: int = 0, n_init: int = 10) -> Tensor:
    """k-means centres of one experience's features.

    Args:
        features: (n, d) features of the experience's training samples.
        k: number of centres; at most n.
        seed: k-means ``random_state``, so the centres are reproducible.
        n_init: k-means restarts (explicit: scikit-learn's default changed in 1.4).

    Returns:
        (k, d) centres, on the device of ``features``, in its dtype or float32 if that is narrower
        (k-means itself runs in float64; bfloat16 centres would lose most of their precision).
    """
    n = features.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"k must be between 1 and the experience's sample count {n}, got k={k}")
    from sklearn.cluster import KMeans  # here, not at module import: scikit-learn takes a tenth of a second to load

    data = features.detach().to("cpu", torch.float64).numpy()
    kmeans = KMeans(n_clusters=k, random_state=seed, n_init=n_init).fit(data)
    centres = np.asarray(kmeans.cluster_centers_)
    dtype = torch.promote_types(features.dtype, torch.float32)
    return torch.from_numpy(centres).to(features.device, dtype)


def fit_class_prototypes(features: Tensor, labels: Tensor, per_class: int, *, seed: int = 0,
                         n_init: int = 10) -> Tensor:
    """k-means centres within each class: ``per_class`` per class (fewer for a class with fewer samples).

    Args:
        features: (n, d) features of the experience's training samples.
        labels: (n,) their class labels.
        per_class: centres per class.
        seed, n_init: as in :func:`fit_prototypes`.

    Returns:
        (m, d) centres, class by class in increasing class order.
    """
    if features.shape[0] != labels.shape[0]:
        raise ValueError(f"features and labels must have the same length, got {features.shape[0]} and {labels.shape[0]}")
    centres = [fit_prototypes(features[labels == c], min(per_class, int((labels == c).sum())), seed=seed, n_init=n_init)
               for c in labels.unique().tolist()]
    return torch.cat(centres)


def kmeans_clustering(k: int = 5, *, per_class: Optional[int] = None, seed: int = 0,
                      n_init: int = 10) -> Callable[[Tensor, Tensor], Tensor]:
    """How a prototype router makes an experience's prototypes: ``k`` k-means centres of its features
    (:func:`fit_prototypes`), or ``per_class`` centres within each class (:func:`fit_class_prototypes`)."""
    if per_class is not None:
        return lambda features, labels: fit_class_prototypes(features, labels.to(features.device), per_class,
                                                             seed=seed, n_init=n_init)
    return lambda features, labels: fit_prototypes(features, k, seed=seed, n_init=n_init)


# --------------------------------------------------------------------------------------------------
# The interface, and CoLoR's router: the nearest prototype.

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

    def expert_scores(self, features: Tensor, num_experts: int) -> Tensor:
        """(n, num_experts) how well each expert fits each sample, higher is better, -inf for an expert the
        router does not know (every expert it knows is one of the model's ``num_experts``); the best is the
        expert :meth:`forward` picks (up to ties). Top-m routing ranks its candidates by it
        (:meth:`~avalanche_color.experts.routed_vit.RoutedExpertViT.propose`)."""
        raise ValueError(f"a {type(self).__name__} picks one expert per sample and scores none: top_m > 1 "
                         f"needs router='prototypes', 'ridge' or 'gaussian'")


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
        return self.owners[self.distances(features).argmin(dim=1)]

    @in_full_precision
    def expert_scores(self, features: Tensor, num_experts: int) -> Tensor:
        """(n, num_experts): minus the distance to each expert's nearest prototype (-inf: none)."""
        distances = self.distances(features)
        nearest = distances.new_full((distances.shape[0], num_experts), float("inf"))
        nearest.scatter_reduce_(1, self.owners.expand(distances.shape[0], -1), distances, "amin")
        return -nearest

    def distances(self, features: Optional[Tensor]) -> Tensor:
        """(n, prototypes) float32 distances of each feature row to every prototype."""
        if not self.owners.numel():
            raise RuntimeError("no prototypes yet: the router is fitted after the first experience")
        if features is None:
            raise ValueError("the prototype router routes by features: give the routing features")
        features = features.float()
        if self.distance == "cosine":
            normalize = nn.functional.normalize
            return 1 - normalize(features, dim=-1) @ normalize(self.prototypes, dim=-1).T
        return torch.cdist(features, self.prototypes, p=2.0 if self.distance == "euclidean" else 1.0)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        take_stored_shapes(self, state_dict, prefix, ("prototypes", "owners"))  # they grow with the stream
        super()._load_from_state_dict(state_dict, prefix, *args)


# --------------------------------------------------------------------------------------------------
# Oracle routing: each sample goes to the newest expert trained on its task label.
#
# Task-incremental evaluation (the paper's "oracle" rows): the router reads the task labels, not
# features, so no routing pass through the backbone is made. It learns nothing: the experts'
# task labels are the expert bank's record, given with each batch.

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


# --------------------------------------------------------------------------------------------------
# Class-level routing: predict each sample's (expert, class) pair; the pair names the expert.
#
# Beyond the paper, off by default (``router="prototypes"`` is CoLoR's nearest prototype).
# The strong class-incremental methods predict a class first (RanPAC, HiDe-Prompt); here
# the predicted targets are (expert, class) pairs, so the same router serves
# domain-incremental streams, where every experience has every class.
#
# The statistics of an expert are fitted from its experience's routing features and labels
# (by :class:`~avalanche_color.training.router_fitting.PrototypeRouterPlugin`, after the expert's
# experience). Until the expert is finished, its samples are *pending*: they count in the
# classifier but a refit of the same expert (an evaluation during its experience, with
# CoLoR++'s features still changing) replaces them; :meth:`ClassRouter.finish` adds them to the
# accumulated sums for good. Everything, pending samples included, is in the ``state_dict``.

ClassRouterKind = Literal["ridge", "gaussian"]
RIDGE_SEED = 0  # the random projection's seed


class ClassRouter(Router):
    """Routes by a classifier over every (expert, class) pair fitted so far.

    Args:
        kind: ``"ridge"`` (:class:`~avalanche_color.routing.classifiers.RandomFeatureRidge`, RanPAC's
            closed-form ridge over random ReLU features) or ``"gaussian"``
            (:class:`~avalanche_color.routing.classifiers.GaussianClassifier`, per-pair means and a
            shared covariance, the closed form of HiDe's Gaussian statistics).
        in_features: width of the routing features.
        width: the ridge's number of random features M.
    """

    pair_experts: Tensor
    pair_classes: Tensor
    pending_expert: Tensor
    pending_features: Tensor
    pending_targets: Tensor

    def __init__(self, kind: ClassRouterKind, in_features: int, width: int) -> None:
        super().__init__()
        self.kind = kind
        self.classifier: Union[RandomFeatureRidge, GaussianClassifier] = (
            RandomFeatureRidge(in_features, width, seed=RIDGE_SEED) if kind == "ridge"
            else GaussianClassifier(in_features))
        self.register_buffer("pair_experts", torch.empty(0, dtype=torch.long))
        self.register_buffer("pair_classes", torch.empty(0, dtype=torch.long))
        self.register_buffer("pending_expert", torch.tensor(-1))
        self.register_buffer("pending_features", torch.empty(0, in_features))
        self.register_buffer("pending_targets", torch.empty(0, dtype=torch.long))

    def knows(self, expert: int) -> bool:
        """Whether ``expert`` has been fitted (pending or finished)."""
        return bool((self.pair_experts == expert).any())

    @torch.no_grad()
    @in_full_precision
    def fit(self, expert: int, features: Tensor, labels: Tensor, *, clustering: Optional[Clustering] = None) -> None:
        """Fit ``expert``'s pairs from its experience's routing features and class labels.

        Replaces the pending samples if they are ``expert``'s; another expert's pending samples
        are kept for good first.
        """
        pending = int(self.pending_expert)
        if pending not in (-1, expert):
            self.finish(pending)
        targets = self._targets(expert, labels.to(self.pair_classes.device))
        self.classifier.fit(features, targets, keep=False)
        self.pending_expert = torch.tensor(expert, device=self.pending_expert.device)
        self.pending_features = features.detach().to(self.pending_features.device, self.pending_features.dtype)
        self.pending_targets = targets

    def finish(self, expert: int) -> None:
        """``expert``'s samples count for good: later fits of other experts keep them."""
        if int(self.pending_expert) != expert:
            return
        self.classifier.add(self.pending_features, self.pending_targets)
        self.pending_expert = torch.tensor(-1, device=self.pending_expert.device)
        self.pending_features = self.pending_features[:0]
        self.pending_targets = self.pending_targets[:0]

    @in_full_precision
    def pair_scores(self, features: Tensor) -> Tensor:
        """(n, pairs) scores; a pair's index is its position in ``pair_experts`` and ``pair_classes``."""
        if not self.pair_experts.numel():
            raise RuntimeError("the class router is fitted after the first experience")
        return self.classifier(features)[:, : len(self.pair_experts)]

    def forward(self, features: Optional[Tensor], task_labels: Optional[Tensor] = None,
                expert_tasks: Optional[Tensor] = None) -> Tensor:
        """The expert of each feature row's best pair, shape (n,)."""
        if features is None:
            raise ValueError(f"the {self.kind} router routes by features: give the routing features")
        return self.pair_experts[self.pair_scores(features).argmax(dim=1)]

    def expert_scores(self, features: Tensor, num_experts: int) -> Tensor:
        """(n, num_experts): each expert's best pair score (-inf: an expert with no pair yet)."""
        scores = self.pair_scores(features)
        best = scores.new_full((scores.shape[0], num_experts), float("-inf"))
        best.scatter_reduce_(1, self.pair_experts.expand(scores.shape[0], -1), scores, "amax")
        return best

    def _targets(self, expert: int, labels: Tensor) -> Tensor:
        """Each label's pair index for ``expert``, adding the pairs not seen before."""
        classes = labels.unique()
        known = self.pair_classes[self.pair_experts == expert]
        new = classes[~torch.isin(classes, known)]
        self.pair_experts = torch.cat((self.pair_experts, torch.full_like(new, expert)))
        self.pair_classes = torch.cat((self.pair_classes, new))
        lookup = {(int(e), int(c)): index for index, (e, c) in
                  enumerate(zip(self.pair_experts.tolist(), self.pair_classes.tolist()))}
        return torch.tensor([lookup[(expert, int(c))] for c in labels.tolist()], dtype=torch.long,
                            device=self.pair_classes.device)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        take_stored_shapes(self, state_dict, prefix,
                           ("pair_experts", "pair_classes", "pending_features", "pending_targets"))
        super()._load_from_state_dict(state_dict, prefix, *args)


# --------------------------------------------------------------------------------------------------
# The router the options name.

def make_router(options: RoutingOptions, num_features: int) -> Router:
    """The router of ``options.router`` for routing features of width ``num_features``."""
    if options.router == "prototypes":
        return PrototypeRouter(options.distance)
    if options.router == "oracle":
        return OracleRouter()
    return ClassRouter(options.router, num_features, options.router_width)
