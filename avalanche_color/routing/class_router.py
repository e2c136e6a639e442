"""Class-level routing: predict each sample's (expert, class) pair; the pair names the expert.

Beyond the paper, off by default (``router="prototypes"`` is CoLoR's nearest prototype).
The strong class-incremental methods predict a class first (RanPAC, HiDe-Prompt); here
the predicted targets are (expert, class) pairs, so the same router serves
domain-incremental streams, where every experience has every class.

The statistics of an expert are fitted from its experience's routing features and labels
(by :class:`~avalanche_color.training.router_plugin.PrototypeRouterPlugin`, after the expert's
experience). Until the expert is finished, its samples are *pending*: they count in the
classifier but a refit of the same expert (an evaluation during its experience, with
CoLoR++'s features still changing) replaces them; :meth:`ClassRouter.finish` adds them to the
accumulated sums for good. Everything, pending samples included, is in the ``state_dict``.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

import torch
from torch import Tensor

from avalanche_color.routing.gaussian import GaussianClassifier
from avalanche_color.routing.ridge import RandomFeatureRidge
from avalanche_color.routing.router import Clustering, Router
from avalanche_color.utils.precision import in_full_precision
from avalanche_color.utils.state import take_stored_shapes

ClassRouterKind = Literal["ridge", "gaussian"]
RIDGE_SEED = 0  # the random projection's seed


class ClassRouter(Router):
    """Routes by a classifier over every (expert, class) pair fitted so far.

    Args:
        kind: ``"ridge"`` (:class:`~avalanche_color.routing.ridge.RandomFeatureRidge`, RanPAC's
            closed-form ridge over random ReLU features) or ``"gaussian"``
            (:class:`~avalanche_color.routing.gaussian.GaussianClassifier`, per-pair means and a
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
