"""Prototypes: the k-means centres of one experience's features, fitted after training on it."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.cluster import KMeans
from torch import Tensor


def fit_prototypes(features: Tensor, k: int, *, seed: int = 0, n_init: int = 10) -> Tensor:
    """k-means centres of one experience's features.

    Args:
        features: (n, d) features of the experience's training samples.
        k: number of centres; at most n.
        seed: k-means ``random_state``, so the centres are reproducible.
        n_init: k-means restarts (explicit: scikit-learn's default changed in 1.4).

    Returns:
        (k, d) centres, on the device and in the dtype of ``features``.
    """
    n = features.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"k must be between 1 and the experience's sample count {n}, got k={k}")
    data = features.detach().to("cpu", torch.float64).numpy()
    kmeans = KMeans(n_clusters=k, random_state=seed, n_init=n_init).fit(data)
    centres = np.asarray(kmeans.cluster_centers_)
    return torch.from_numpy(centres).to(features.device, features.dtype)
