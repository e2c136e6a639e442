"""Rank-r LoRA experts on the query and value parts of a fused qkv projection.

One :class:`QKVExperts` replaces one ``attn.qkv`` of a timm ViT. It keeps the
original linear layer as ``base_layer`` (frozen, shared by every expert) and a
list of :class:`QVLoRA` experts. The experts of a forward are its argument,
``layer(x, experts)``: none, one for the whole batch, or one per contiguous run of
samples (a batch sorted by expert, see :mod:`avalanche_color.lora.segments`).

Two ways to compute an expert, chosen by the caller (``trained``: the expert that trains),
never by ``requires_grad`` or the grad mode:

* low-rank, for the expert that trains: ``base(x)`` plus the update ``s x A^T B^T``:
  one thin matmul down (``x A^T`` for q and v at once) and one up per part, added onto
  the q and v columns only (no matmul over the zero key block), through
  :class:`QVLowRankLinear`, whose backward computes only what is needed (input
  gradients through the frozen weight, A and B gradients; no copies of the qkv gradient);
* for frozen experts: one matmul with ``W + s B A`` when the whole batch has one expert
  (built per forward: a d x r x 2d product, small next to the tokens' matmul), or, for a
  mixed batch, one frozen matmul for the whole batch with each expert's update added in
  place on its run of samples.

A mixed batch can also come unsorted, as one expert index per sample (a tensor): then every
expert's A and B are stacked (cached, :mod:`avalanche_color.lora.stacked`), each sample's factors
gathered by its index and applied with two batched matmuls. Its kernels do not grow with the
number of experts, its shapes are fixed and it needs no host sync (for GPUs, CUDA graphs and
``torch.compile``); on a CPU the runs of a sorted batch are faster.

The experts are float32 on a bfloat16 or float16 backbone (:mod:`avalanche_color.lora.dtypes`), so that
SGD's small updates are kept; every kernel casts their factors to the tokens' dtype (or autocast's) when
it uses them, as autocast casts a linear layer's weight: on a float32 backbone nothing is cast.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Optional

import torch
from torch import Tensor, nn

from avalanche_color.lora.dtypes import trained_dtype
from avalanche_color.lora.qv_low_rank import QVLowRankLinear, _add_qv_update_
from avalanche_color.lora.segments import ExpertSelection
from avalanche_color.lora.stacked import cached_stacks, pad_dim, source_key, with_live_slot


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

    @property
    def in_features(self) -> int:
        return self.base_layer.in_features

    def new_expert(self, rank: int, alpha: float) -> QVLoRA:
        """A new expert for this layer (on its device), not yet added: float32 on a bfloat16 or float16 layer
        (see :mod:`avalanche_color.lora.dtypes`), else in the layer's dtype."""
        weight = self.base_layer.weight
        return QVLoRA(self.in_features, self.head_width, rank, alpha).to(device=weight.device,
                                                                        dtype=trained_dtype(weight.dtype))

    def add_expert(self, rank: int, alpha: float) -> QVLoRA:
        """Add a new expert; its index is its position in :attr:`experts`."""
        expert = self.new_expert(rank, alpha)
        self.experts.append(expert)
        return expert

    def forward(self, x: Tensor, experts: ExpertSelection = None, trained: Optional[int] = None) -> Tensor:
        """``[q | k | v]`` of ``x`` with ``experts``' q and v updates.

        Args:
            x: tokens (..., in_features).
            experts: ``None`` for the bare backbone, an int for one expert on the whole
                batch, ``Segments`` for one expert per run of samples, or a (batch,) integer
                tensor: one expert per sample, in any order (gathered, see the module docstring).
            trained: the expert that trains: computed low-rank, so gradients reach its A and B;
                every other expert is computed frozen (merged, or its update added in place).
        """
        if experts is None:
            return self.base_layer(x)
        if isinstance(experts, Tensor):
            return self._gathered_forward(x, experts, trained)
        if isinstance(experts, int):
            if experts == trained:
                return self._low_rank_forward(x, self.experts[experts])
            return nn.functional.linear(x, self.merged_weight(experts), self.base_layer.bias)
        # The frozen matmul once for all samples, then each frozen expert's low-rank update added
        # in place on its contiguous run (slices, no gather or scatter).
        out = self.base_layer(x)
        trained_run = None
        for e, run in experts:
            if e == trained:
                trained_run = run
                continue
            expert = self.experts[e]
            low = (x[run].reshape(-1, x.shape[-1]) @ expert.down().to(x.dtype).T).to(out.dtype)
            _add_qv_update_(out[run].view(-1, out.shape[-1]), low, expert.B.to(out.dtype), expert.scaling)
        if trained_run is None:
            return out
        # The expert that trains, in a mixed batch (an evaluation inside training): its run computed
        # low-rank, so that gradients reach it; the other runs keep their frozen updates.
        start, stop, _ = trained_run.indices(out.shape[0])
        trained_out = self._low_rank_forward(x[start:stop], self.experts[trained])
        return torch.cat((out[:start], trained_out, out[stop:]))

    def merged_weight(self, expert: int) -> Tensor:
        """The qkv weight with ``expert``'s q and v updates folded in."""
        d = self.head_width
        weight = self.base_layer.weight
        delta = self.experts[expert].delta_weight().to(weight.dtype)
        return torch.cat((weight[:d] + delta[0], weight[d : 2 * d], weight[2 * d :] + delta[1]))

    def _gathered_forward(self, x: Tensor, experts: Tensor, trained: Optional[int]) -> Tensor:
        """``base(x)`` plus each sample's expert's q and v updates, its factors gathered by ``experts[i]``.

        Kernels: the frozen matmul, two gathers, two batched matmuls (down to 2r, up to q and v)
        and one in-place add, whatever the number of experts; gradients reach ``trained``'s A and B.
        """
        out = self.base_layer(x)
        batch, width = x.shape[0], x.shape[-1]
        tokens = math.prod(x.shape[1:-1])
        down, up = self.stacked_factors(trained)  # (E, 2r, in) and (E, 2, r, d), scaling in up
        rank = down.shape[1] // 2
        # Gathered in the experts' dtype, then cast to the tokens' (as autocast casts them), so that the trained
        # expert's gradient is summed over its samples in float32 beside a bfloat16 backbone too.
        down, up = down.index_select(0, experts).to(x.dtype), up.index_select(0, experts).to(x.dtype)
        low = torch.bmm(x.reshape(batch, tokens, width), down.transpose(1, 2))
        # (batch, 2, tokens, r) @ (batch, 2, r, d): q and v in one batched matmul.
        update = torch.matmul(low.view(batch, tokens, 2, rank).transpose(1, 2), up)
        qv_columns = out.view(batch, tokens, 3, self.head_width)[:, :, ::2]  # (batch, tokens, 2, d), a view
        qv_columns.add_(update.transpose(1, 2).to(out.dtype))
        return out

    def stacked_factors(self, trained: Optional[int] = None) -> tuple[Tensor, Tensor]:
        """Every expert's factors stacked: ``down`` (E, 2r, in) is ``[A_q; A_v]``, ``up`` (E, 2, r, d) is
        ``scaling * [B_q^T, B_v^T]``; experts of a lower rank are padded with zeros to the largest.

        Cached until an expert changes; the slot of ``trained`` is its live parameters, so that
        gradients reach them (and its updates at each step need no new stack).
        """
        rank = max(expert.rank for expert in self.experts)
        frozen = [expert for index, expert in enumerate(self.experts) if index != trained]
        live = () if trained is None else (trained, self.experts[trained].A.dtype, self.experts[trained].A.device)
        key = source_key([t for expert in frozen for t in (expert.A, expert.B)], len(self.experts), *live)
        down, up = cached_stacks(self, key, lambda: (
            torch.stack([_padded_down(expert, rank) for expert in self.experts]),
            torch.stack([_padded_up(expert, rank) for expert in self.experts])))
        if trained is None:
            return down, up
        expert = self.experts[trained]
        return (with_live_slot(down, trained, _padded_down(expert, rank)),
                with_live_slot(up, trained, _padded_up(expert, rank)))

    def _low_rank_forward(self, x: Tensor, expert: QVLoRA) -> Tensor:
        """``base(x)`` plus ``expert``'s q and v updates, differentiable (see :class:`QVLowRankLinear`)."""
        weight, bias = self.base_layer.weight, self.base_layer.bias
        device_type = x.device.type
        # A and B are float32 (lora.dtypes); a custom Function gets one dtype: the tokens', or autocast's.
        if torch.is_autocast_enabled(device_type):
            # Autocast does not reach inside a custom Function: cast as it would cast a
            # linear layer (everything to the autocast dtype), then compute in that dtype.
            dtype = torch.get_autocast_dtype(device_type)
            with torch.autocast(device_type, enabled=False):
                cast = lambda t: None if t is None else t.to(dtype)  # noqa: E731
                return QVLowRankLinear.apply(cast(x), cast(weight), cast(bias), cast(expert.A), cast(expert.B),
                                             expert.scaling)
        return QVLowRankLinear.apply(x, weight, bias, expert.A.to(x.dtype), expert.B.to(x.dtype), expert.scaling)


def _padded_down(expert: QVLoRA, rank: int) -> Tensor:
    """(2 rank, in): the expert's A of q and of v, each zero-padded to ``rank`` rows."""
    return pad_dim(expert.A, 1, rank).reshape(2 * rank, -1)


def _padded_up(expert: QVLoRA, rank: int) -> Tensor:
    """(2, rank, d): ``scaling * B^T`` of q and of v, each zero-padded to ``rank`` rows."""
    return pad_dim(expert.B.transpose(1, 2) * expert.scaling, 1, rank)


class QVExpertKind:
    """CoLoR's expert kind for a routed model: one :class:`QVLoRA` of rank ``rank`` (scaling
    ``alpha / rank``) in every given :class:`QKVExperts` layer, whose ``experts`` lists are the slots."""

    def __init__(self, layers: Sequence[QKVExperts], rank: int, alpha: float) -> None:
        self.layers = list(layers)
        self.rank = rank
        self.alpha = alpha
        self.slots = [layer.experts for layer in self.layers]

    def new_expert_modules(self) -> list[nn.Module]:
        """One new :class:`QVLoRA` per layer (B = 0: the new expert computes the backbone exactly)."""
        return [layer.new_expert(self.rank, self.alpha) for layer in self.layers]
