"""Rank-r LoRA experts on the query and value parts of a fused qkv projection.

One :class:`QKVExperts` replaces one ``attn.qkv`` of a timm ViT. It keeps the
original linear layer as ``base_layer`` (frozen, shared by every expert) and a
list of :class:`QVLoRA` experts. Which expert acts is chosen from outside, per
forward, with :meth:`QKVExperts.select`: none, one for the whole batch, or one per
sample (a mixed batch, computed with batched matrix products, no loop).
"""

from __future__ import annotations

import math
from typing import Optional, Union

import torch
from torch import Tensor, nn

ExpertSelection = Optional[Union[int, Tensor]]


class QVLoRA(nn.Module):
    """One expert's low-rank updates of the query and value projections.

    ``delta_W = scaling * B @ A`` for each of q and v, stacked on the first axis
    (index 0 is the query, 1 the value).

    Args:
        in_features: width of the projection's input.
        out_features: width of one of q, k, v (a third of the fused output).
        rank: the rank r of each update.
        alpha: LoRA's alpha; the update is scaled by ``alpha / rank``.
    """

    def __init__(self, in_features: int, out_features: int, rank: int, alpha: float) -> None:
        super().__init__()
        self.rank = rank
        self.scaling = alpha / rank
        self.A = nn.Parameter(torch.empty(2, rank, in_features))
        # B starts at zero, so a new expert computes exactly what the backbone does.
        self.B = nn.Parameter(torch.zeros(2, out_features, rank))
        for a in self.A:
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))

    def delta_weight(self) -> Tensor:
        """The (2, out, in) weight updates of q and v, scaling included."""
        return self.scaling * self.B @ self.A


class QKVExperts(nn.Module):
    """A fused qkv linear layer with LoRA experts on its q and v parts.

    Args:
        base_layer: the ``nn.Linear`` to adapt; its output is ``[q | k | v]``.
    """

    def __init__(self, base_layer: nn.Linear) -> None:
        super().__init__()
        if base_layer.out_features % 3:
            raise ValueError(
                f"base_layer must be a fused qkv projection with 3*d outputs, "
                f"got out_features={base_layer.out_features}"
            )
        self.base_layer = base_layer
        self.head_width = base_layer.out_features // 3
        self.experts = nn.ModuleList()
        self._selection: ExpertSelection = None

    @property
    def in_features(self) -> int:
        return self.base_layer.in_features

    def add_expert(self, rank: int, alpha: float) -> QVLoRA:
        weight = self.base_layer.weight
        expert = QVLoRA(self.in_features, self.head_width, rank, alpha)
        expert.to(device=weight.device, dtype=weight.dtype)
        self.experts.append(expert)
        return expert

    def select(self, selection: ExpertSelection) -> None:
        """Choose the experts of the next forwards.

        Args:
            selection: ``None`` for the bare backbone, an int for one expert on
                the whole batch, or a LongTensor of shape (batch,) for one expert
                per sample.
        """
        self._selection = selection

    def forward(self, x: Tensor) -> Tensor:
        out = self.base_layer(x)
        selection = self._selection
        if selection is None:
            return out
        if isinstance(selection, int):
            delta = self._single_expert_delta(x, self.experts[selection])
        else:
            delta = self._per_sample_delta(x, selection)
        d = self.head_width
        q, k, v = out.split(d, dim=-1)
        return torch.cat((q + delta[0], k, v + delta[1]), dim=-1)

    def _single_expert_delta(self, x: Tensor, expert: QVLoRA) -> Tensor:
        # (…, in) -> (2, …, r) -> (2, …, out): two thin matmuls, never the d x d update.
        low = torch.einsum("...i,jri->j...r", x, expert.A)
        return expert.scaling * torch.einsum("j...r,jor->j...o", low, expert.B)

    def _per_sample_delta(self, x: Tensor, expert_ids: Tensor) -> Tensor:
        if expert_ids.shape != x.shape[:1]:
            raise ValueError(
                f"expert_ids must hold one expert per sample, shape ({x.shape[0]},), "
                f"got {tuple(expert_ids.shape)}"
            )
        experts = list(self.experts)
        ranks = {e.rank for e in experts}
        if len(ranks) != 1:
            raise ValueError(f"a mixed batch needs experts of one rank, found ranks {sorted(ranks)}")
        scaling = torch.tensor([e.scaling for e in experts], device=x.device, dtype=x.dtype)
        A = torch.stack([e.A for e in experts])[expert_ids]  # (b, 2, r, in)
        B = torch.stack([e.B for e in experts])[expert_ids]  # (b, 2, out, r)
        low = torch.einsum("b...i,bjri->jb...r", x, A)
        delta = torch.einsum("jb...r,bjor->jb...o", low, B)
        return delta * scaling[expert_ids].view(1, -1, *([1] * (x.dim() - 1)))
