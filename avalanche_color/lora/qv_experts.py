"""Rank-r LoRA experts on the query and value parts of a fused qkv projection.

One :class:`QKVExperts` replaces one ``attn.qkv`` of a timm ViT. It keeps the
original linear layer as ``base_layer`` (frozen, shared by every expert) and a
list of :class:`QVLoRA` experts. Which expert acts is chosen from outside, per
forward, with :meth:`QKVExperts.select`: none, one for the whole batch, or one
per contiguous run of samples (a batch sorted by expert, see
:mod:`avalanche_color.routing.segments`).

Two ways to compute an expert, chosen by whether gradients are needed:

* low-rank: ``base(x)`` plus the update ``s x A^T B^T``, two thin matmuls. Used in training (the frozen weight gets no gradient) and for mixed
  batches (one frozen matmul for the whole batch, one update per run of samples);
* merged: one matmul with ``W + s B A`` (built per forward: a d x r x 2d product,
  small next to the tokens' matmul). Used when a whole batch goes to one expert
  without gradients (oracle evaluation, a batch routed to one expert).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from avalanche_color.routing.segments import ExpertSelection


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

    def down(self) -> Tensor:
        """(2r, in): A of q and A of v stacked, so both project down in one matmul."""
        return self.A.reshape(2 * self.rank, -1)

    def up(self) -> Tensor:
        """(3 out, 2r): B of q and v placed on the q and v rows of a fused qkv output.

        The key rows are zero, so one matmul adds both updates and leaves k alone.
        """
        zeros = self.B.new_zeros(self.B.shape[1:])
        return torch.cat((
            torch.cat((self.B[0], zeros), dim=1),
            torch.cat((zeros, zeros), dim=1),
            torch.cat((zeros, self.B[1]), dim=1),
        ))


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
                the whole batch, or ``Segments`` for one expert per run of
                samples.
        """
        self._selection = selection

    def forward(self, x: Tensor) -> Tensor:
        selection = self._selection
        if selection is None:
            return self.base_layer(x)
        if isinstance(selection, int):
            if torch.is_grad_enabled():
                return self._add_low_rank_update(self.base_layer(x), x, self.experts[selection])
            return self._merged_forward(x, selection)
        # A mixed batch: the frozen matmul once for all samples, then each expert's
        # low-rank update on its contiguous run (slices, no gather or scatter).
        out = self.base_layer(x)
        return torch.cat([self._add_low_rank_update(out[run], x[run], self.experts[e]) for e, run in selection])

    def merged_weight(self, expert: int) -> Tensor:
        """The qkv weight with ``expert``'s q and v updates folded in."""
        d = self.head_width
        delta = self.experts[expert].delta_weight()
        weight = self.base_layer.weight
        return torch.cat((weight[:d] + delta[0], weight[d : 2 * d], weight[2 * d :] + delta[1]))

    def _merged_forward(self, x: Tensor, expert: int) -> Tensor:
        return nn.functional.linear(x, self.merged_weight(expert), self.base_layer.bias)

    def _add_low_rank_update(self, out: Tensor, x: Tensor, expert: QVLoRA) -> Tensor:
        """``out`` plus ``x``'s q and v updates: ``out + s (x A^T) B^T`` in one fused addmm.

        Out of place on purpose: an in-place add on slices of ``out`` costs a copy
        of the whole qkv gradient per layer in the backward pass.
        """
        low = x.reshape(-1, x.shape[-1]) @ expert.down().T
        updated = torch.addmm(out.reshape(-1, out.shape[-1]), low, expert.up().T, alpha=expert.scaling)
        return updated.view(out.shape)
