"""InfLoRA's model: W = W0 + sum_t B_t A_t on k and v of every block, each A_t designed and fixed, and the
protected subspace per layer that A_t is designed outside of.

What comes from where (InfLoRA paper, Liang & Li CVPR 2024, its method section; official code
liangyanshuo/InfLoRA, ``models/vit_inflora.py`` and ``methods/inflora.py``). The paper names
the designed dimensionality-reduction matrix B_t and the trained one A_t; the code (and this
module) the other way round: ``A_t`` (r x d) is designed and fixed, ``B_t`` (d x r) trains.

* LoRA on the key and value parts of every block's fused qkv (``Attention_LoRA``:
  ``lora_A_k``/``lora_B_k``, ``lora_A_v``/``lora_B_v``), one branch per task, the same ``A_t``
  for k and v, no scaling; rank 10 (``configs/cifar100_inflora.json``).
* Before task t: ``A_t`` from the task's input representation projected outside the protected
  subspace of earlier tasks (:func:`design_reduction`); ``B_t`` starts at zero and is the only LoRA
  weight that trains.
* After task t: the protected subspaces grow by the task's inputs (DualGPM, threshold epsilon_t,
  :class:`ProtectedSubspace`), and the task's branch is kept, frozen, summed with the others (as the
  code; merging it into W0 would give the same outputs).

The protected subspace per layer: the input representation of earlier tasks, kept DualGPM-style.
For every LoRA'd layer (each block's qkv, whose input is the block's normed tokens):

* :func:`~avalanche_color.peers.lora_sum.model.input_covariances`: the input representation
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
from collections.abc import Iterator, Sequence
from typing import ClassVar

import torch
from torch import Tensor, nn

from avalanche_color.peers.inf_lora.config import InfLoRAConfig
from avalanche_color.peers.lora_sum.model import LoRASumViT, Mixing, Part


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


class InfLoRAViT(LoRASumViT):
    """A frozen timm ViT with InfLoRA branches on k and v of every block and one head over all classes.

    Args:
        vit: a timm ``VisionTransformer``; the model adapts a copy.
        config: :class:`~avalanche_color.peers.inf_lora.config.InfLoRAConfig`.
    """

    parts: ClassVar[tuple[Part, Part]] = ("k", "v")
    config: InfLoRAConfig
    config_class: ClassVar[type[InfLoRAConfig]] = InfLoRAConfig

    def __init__(self, vit: nn.Module, config: InfLoRAConfig) -> None:
        super().__init__(vit, config)
        self.subspaces = nn.ModuleList(ProtectedSubspace(layer.in_features) for layer in self.layers)
        self.subspaces.to(self.device)

    def mixing(self) -> Mixing:
        training = self.training_component()  # every branch with coefficient 1; the one learning runs low-rank
        return Mixing(low_rank=frozenset(() if training is None else (training,)))

    def component_parameter_count(self, component: int) -> int:
        """Its B in every layer (A is designed, not trained)."""
        return sum(layer.components[component].B.numel() for layer in self.layers)

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        """The head, and the current branch's B (its A is designed, not trained)."""
        yield from super().trainable_parameters()
        training = self.training_component()
        if training is not None:
            for layer in self.layers:
                yield layer.components[training].B

    @torch.no_grad()
    def design_component(self, covariances: Sequence[Tensor]) -> None:
        """Set the current branch's ``A_t`` in every layer from the new task's input covariances."""
        for layer, subspace, covariance in zip(self.layers, self.subspaces, covariances):
            component = layer.components[-1]
            reduction = design_reduction(covariance, subspace, component.rank)
            component.A.copy_(reduction.to(component.A.dtype).expand_as(component.A))

    @torch.no_grad()
    def protect(self, covariances: Sequence[Tensor]) -> None:
        """Add the current task's inputs (its covariances) to every layer's protected subspace."""
        threshold = self.config.threshold_at(self.num_experts - 1)
        for subspace, covariance in zip(self.subspaces, covariances):
            subspace.update(covariance, threshold)
