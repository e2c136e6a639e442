"""InfLoRA's protected subspace per layer: the input representation of earlier tasks, kept DualGPM-style.

For every LoRA'd layer (each block's qkv, whose input is the block's normed tokens):

* :func:`~avalanche_color.peers.lora_sum.covariances.input_covariances`: the input representation
  matrix ``R = mean over tokens of x x^T`` (d x d) of one experience's training data (``cur_matrix``
  in the code's ``Attention_LoRA``).
* :meth:`ProtectedSubspace.update`, after each task: the bases of DualGPM, which InfLoRA uses
  (GPM's bases kept as in the DualGPM paper; code ``update_DualGPM`` in ``methods/inflora.py``).
  The first task keeps the top singular vectors of ``R`` whose cumulative squared singular values
  stay below the fraction epsilon (``threshold``) of the total (at least one); later tasks add the
  top singular vectors of ``R``'s part outside the kept space until the kept fraction reaches
  epsilon. Once the kept space is wider than d/2 the complement is kept instead (``retain``), and
  shrunk by the new task's directions inside it until the fraction left outside falls below
  1 - epsilon.
* :func:`design_reduction`, before each task: ``A_t`` = the top-r left singular vectors of the new
  task's ``R`` projected onto the free space (``R - M M^T R``, or ``Q Q^T R`` with a kept complement),
  divided by sqrt(3) as the code does. Our additions: the rows are projected onto the free space
  once more, which changes nothing when the projected ``R`` has rank >= r and keeps the rows out of
  the protected space when it has less (small models, tiny tasks); and every singular vector's sign
  is fixed (largest entry positive), so that torchrun ranks design what one process designs.

The code's one quirk left out: after the first task it labels a kept space wider than d/2 as a
complement without taking the complement (and then fails its own assertion); here the same
switch to the complement as after every later task applies.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

REDUCTION_SCALE = 1 / math.sqrt(3)  # InfLoRA's code: U[:, :r].T / sqrt(3)


class ProtectedSubspace(nn.Module):
    """One layer's protected input subspace: an orthonormal basis of it, or of its complement.

    Buffers (saved with the model): ``basis`` (d, k) float64 and ``retain`` (True: ``basis``
    spans the complement of the protected space).
    """

    basis: Tensor
    retain: Tensor

    def __init__(self, width: int) -> None:
        super().__init__()
        self.register_buffer("basis", torch.zeros(width, 0, dtype=torch.float64))
        self.register_buffer("retain", torch.zeros((), dtype=torch.bool))

    @property
    def width(self) -> int:
        return self.basis.shape[0]

    def free_projector(self) -> Tensor:
        """(d, d) projector onto the inputs a new task may use (float64)."""
        basis = self.basis
        if bool(self.retain):
            return basis @ basis.T
        return torch.eye(self.width, dtype=basis.dtype, device=basis.device) - basis @ basis.T

    def protected_basis(self) -> Tensor:
        """(d, k) orthonormal basis of the protected space."""
        if not bool(self.retain):
            return self.basis
        return _complement(self.basis)

    @torch.no_grad()
    def update(self, covariance: Tensor, threshold: float) -> None:
        """Protect the task whose input representation is ``covariance`` to the fraction ``threshold``."""
        covariance = covariance.to(self.basis)
        total = torch.linalg.svdvals(covariance).square().sum()
        if total == 0:
            return
        if bool(self.retain):
            self._shrink_complement(covariance, total, threshold)
        else:
            self._extend(covariance, total, threshold)
        if not bool(self.retain) and self.basis.shape[1] > self.width / 2:
            self.basis, self.retain = _complement(self.basis), torch.ones_like(self.retain)

    def _extend(self, covariance: Tensor, total: Tensor, threshold: float) -> None:
        kept = self.basis
        outside = covariance - kept @ (kept.T @ covariance)
        U, S = _left_singular_vectors(outside), torch.linalg.svdvals(outside)
        ratios = S.square() / total
        if not kept.shape[1]:
            # The first task (the code's Eq-5): the directions whose cumulative fraction stays below
            # epsilon, at least one.
            count = max(int((ratios.cumsum(0) < threshold).sum()), 1)
        else:
            accumulated = 1 - ratios.sum()  # the fraction the kept space already holds (Eq-9)
            count = 0
            while count < len(ratios) and accumulated < threshold:
                accumulated += ratios[count]
                count += 1
        self.basis = torch.cat((kept, U[:, :count]), dim=1)[:, : self.width]

    def _shrink_complement(self, covariance: Tensor, total: Tensor, threshold: float) -> None:
        free = self.basis
        inside = free @ (free.T @ covariance)
        U, S = _left_singular_vectors(inside), torch.linalg.svdvals(inside)
        ratios = S.square() / total
        accumulated = ratios.sum()  # the fraction still outside the protected space
        count = 0
        while count < len(ratios) and accumulated >= 1 - threshold:
            accumulated -= ratios[count]
            count += 1
        if count:
            rest = free - U[:, :count] @ (U[:, :count].T @ free)
            self.basis = _left_singular_vectors(rest)[:, : max(free.shape[1] - count, 0)]

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args) -> None:
        stored = state_dict.get(prefix + "basis")
        if stored is not None:  # the basis's width grows with the stream: take the stored shape
            self.basis = torch.empty_like(stored, device=self.basis.device)
        super()._load_from_state_dict(state_dict, prefix, *args)


def _complement(basis: Tensor) -> Tensor:
    """An orthonormal basis of the complement of ``basis``'s span (columns orthonormal)."""
    return _left_singular_vectors(basis, full=True)[:, basis.shape[1]:]


def design_reduction(covariance: Tensor, subspace: ProtectedSubspace, rank: int) -> Tensor:
    """(rank, d) ``A_t``: the top-``rank`` directions of the new task's inputs in the free space, / sqrt(3)."""
    projector = subspace.free_projector()
    projected = projector @ covariance.to(projector)
    U = _left_singular_vectors(projected)[:, :rank]
    return (projector @ U).T * REDUCTION_SCALE


def _left_singular_vectors(matrix: Tensor, full: bool = False) -> Tensor:
    """The left singular vectors, each with its largest entry positive.

    Their signs are arbitrary; fixed, processes whose matrices differ in the last bits (torchrun
    ranks against one process) keep the same bases and design the same A_t. Spans are unchanged.
    """
    U = torch.linalg.svd(matrix, full_matrices=full)[0]
    largest = U.gather(0, U.abs().argmax(dim=0, keepdim=True))
    return U * torch.where(largest < 0, -1.0, 1.0).to(U)
