"""The authors' augmented triplet loss (``utils/losses.py``, ``AugmentedTripletLoss``), vectorised.

For L2-normalised features ``f`` (n, d) with labels ``y``, and stored class prototypes:

* ``D_ij = sqrt(max(||f_i||^2 + ||f_j||^2 - 2 f_i . f_j, 1e-12))`` (the expansion form: the diagonal is 1e-6);
* the hardest positive ``ap_i = max_{j: y_j = y_i} D_ij`` (the anchor itself included);
* the hardest negative ``an_i = min_{j: y_j != y_i} D_ij``, or ``ap_i + margin`` when the batch holds no
  other class; then ``an_i = min(an_i, min_c max(||f_i - c/||c||||, 1e-12))`` over the prototypes
  (constants), all of them as the code (``same_class="include"``), or all but the anchor's own
  class's (``"exclude"``, for streams where a class returns);
* the loss ``mean_i max(0, ap_i - an_i + margin)`` (``nn.MarginRankingLoss`` with y = 1).

Rows marked not ``real`` (the padding of a batch gathered from several ranks) are neither anchors nor
candidates.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from avalanche_color.peers.lora_sub.config import SameClassPrototypes


def augmented_triplet_loss(features: Tensor, labels: Tensor, prototypes: Tensor, prototype_classes: Tensor,
                           margin: float, same_class: SameClassPrototypes = "include",
                           real: Optional[Tensor] = None) -> Tensor:
    """The loss of normalised ``features`` (n, d) with ``labels`` (n,), against ``prototypes`` (p, d) of
    ``prototype_classes`` (p,); ``p`` may be 0. ``real`` (n,), bool: the rows that count (None: all)."""
    squares = features.square().sum(dim=1, keepdim=True)
    distances = (squares + squares.T - 2 * features @ features.T).clamp(min=1e-12).sqrt()
    same = labels[:, None] == labels[None, :]
    candidates = same.new_ones(()) if real is None else real[None, :]
    positive, negative = same & candidates, ~same & candidates
    positive.diagonal().fill_(True)  # the anchor itself: a padding row's too, so every term stays finite
    hardest_positive = distances.masked_fill(~positive, float("-inf")).amax(dim=1)
    hardest_negative = distances.masked_fill(~negative, float("inf")).amin(dim=1)
    hardest_negative = torch.where(negative.any(dim=1), hardest_negative, hardest_positive + margin)
    if len(prototypes):
        centres = (prototypes / prototypes.norm(dim=1, keepdim=True)).to(features.dtype).detach()
        # The direct form ||f_i - c||, as the code's torch.norm, without an (n, p, d) difference tensor.
        to_prototypes = torch.cdist(features, centres, compute_mode="donot_use_mm_for_euclid_dist").clamp(min=1e-12)
        if same_class == "exclude":
            to_prototypes = to_prototypes.masked_fill(labels[:, None] == prototype_classes[None, :], float("inf"))
        hardest_negative = torch.minimum(hardest_negative, to_prototypes.amin(dim=1))
    losses = torch.relu(hardest_positive - hardest_negative + margin)
    if real is None:
        return losses.mean()
    return (losses * real).sum() / real.sum()  # the mean over real anchors, without reading their count
