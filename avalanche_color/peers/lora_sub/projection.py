"""The subspace LoRA subtraction keeps a new task's updates in: the principal directions of its inputs.

From the authors' ``optimgrad/adam_proj.py`` (``get_eigens``, ``get_transforms``): per layer, the
singular values ``s`` (descending) and vectors ``V`` of the input covariance of the subtracted
network; ``k`` = 1 + the first index where ``cumsum(s) / sum(s)`` reaches the threshold (the
singular values themselves, not their squares: for a covariance they are its eigenvalues); and
``P = V_k V_k^T / ||V_k V_k^T||_F``, whose norm ``sqrt(k)`` divides every projected step.
"""

from __future__ import annotations

import torch
from torch import Tensor


def principal_projection(covariance: Tensor, threshold: float) -> tuple[Tensor, int]:
    """``(P, k)`` for one layer's (d, d) input covariance: ``P`` (d, d) in the covariance's dtype.

    A covariance whose energy never reaches ``threshold`` in floating point (or is all zero) keeps
    every direction, ``k = d``, where the code would fail on an empty index.
    """
    _, s, Vh = torch.linalg.svd(covariance)
    reached = torch.nonzero(s.cumsum(0) / s.sum() >= threshold)
    k = int(reached[0, 0]) + 1 if len(reached) else len(s)
    basis = Vh[:k].mT  # (d, k): the right singular vectors, as torch.svd's V
    outer = basis @ basis.mT
    return outer / torch.linalg.matrix_norm(outer), k
