"""Prototypes: the k-means centres of one experience's features, fitted after training on it."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


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
