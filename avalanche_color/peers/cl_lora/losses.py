"""CL-LoRA's training terms as plain functions (``models/cllora.py`` and ``backbone/linears.py`` of the
authors' code): the cosine proxy head, the distillation of the shared blocks, the gradient
reassignment of that distillation, and the orthogonality of the block weights."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.nn import functional as F


def cosine_logits(features: Tensor, weight: Tensor, sigma: Tensor) -> Tensor:
    """``σ cos(f, w_c)`` per class c (``CosineLinearFeature``; ``F.normalize``'s eps 1e-12 on both), in the
    weight's dtype (a bfloat16 ViT's features are lifted to the float32 proxy)."""
    return sigma * (F.normalize(features.to(weight.dtype), dim=1) @ F.normalize(weight, dim=1).T)


def distillation_loss(student: Tensor, teacher: Tensor, temperature: float) -> Tensor:
    """``-(1/B) Σ_b Σ_c softmax(z_T/T)_c log_softmax(z_S/T)_c`` (``_KD_loss``: no T², the teacher's
    logits not detached, so the loss also reaches the head through them)."""
    soft = torch.softmax(teacher / temperature, dim=1)
    return -(soft * torch.log_softmax(student / temperature, dim=1)).sum() / student.shape[0]


def reassignment_weights(teacher_up: Tensor) -> Tensor:
    """Per row i of the teacher's up projection U (..., d, r): ``d n_i / Σ_j n_j`` with ``n_i = ||U[i, :]||``
    (mean 1); the distillation gradient of the shared U is multiplied row by row by it. A teacher whose
    U is all zeros (no step ever taken) gives weights 1, where the code would divide 0 by 0."""
    norms = torch.linalg.vector_norm(teacher_up, dim=-1)
    total = norms.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, norms.shape[-1] * norms / torch.where(total > 0, total, 1), 1.0)


def orthogonality_loss(earlier: Sequence[Tensor], current: Tensor, eps: float = 1e-8) -> Tensor:
    """``mean_j |<w_j / (||w_j|| + eps), w / (||w|| + eps)>|`` over the flattened block weights (all three
    rows, the unused k row included: ``compute_orthogonality_loss``); 0 without earlier ones."""
    if not earlier:
        return current.new_zeros(())
    unit = current.flatten() / (torch.linalg.vector_norm(current.flatten()) + eps)
    dots = [(w.flatten() / (torch.linalg.vector_norm(w.flatten()) + eps) * unit).sum().abs() for w in earlier]
    return torch.stack(dots).mean()
