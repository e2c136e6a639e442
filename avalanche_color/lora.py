"""Rank-r LoRA experts on the query and value parts of a fused qkv projection: the layer, its kernels,
and timm's ViT forward with the experts passed to every qkv layer as an argument.

One :class:`QKVExperts` replaces one ``attn.qkv`` of a timm ViT. It keeps the
original linear layer as ``base_layer`` (frozen, shared by every expert) and a
list of :class:`QVLoRA` experts. The experts of a forward are its argument,
``layer(x, experts)``: none, one for the whole batch, or one per contiguous run of
samples (a batch sorted by expert, see :data:`Segments`).

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
expert's A and B are stacked (cached, :func:`cached_stacks`), each sample's factors
gathered by its index and applied with two batched matmuls. Its kernels do not grow with the
number of experts, its shapes are fixed and it needs no host sync (for GPUs, CUDA graphs and
``torch.compile``); on a CPU the runs of a sorted batch are faster.

The experts are float32 on a bfloat16 or float16 backbone (:func:`trained_dtype`), so that
SGD's small updates are kept; every kernel casts their factors to the tokens' dtype (or autocast's) when
it uses them, as autocast casts a linear layer's weight: on a float32 backbone nothing is cast.

From top to bottom: the dtypes and the expert selection of a forward; the experts (:class:`QVLoRA`,
:class:`QKVExperts`, :class:`QVExpertKind`); the low-rank kernels; the stacks of the gathered kernel;
timm's ViT forward with the experts as an argument (:func:`expert_tokens`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Optional, Union
from weakref import WeakKeyDictionary

import torch
from timm.models.vision_transformer import Attention, Block, VisionTransformer
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

# --------------------------------------------------------------------------------------------------
# The dtype trained weights are kept in beside a frozen backbone, and the dtype they compute in.
#
# A trained weight (a LoRA factor, a head) is kept in float32, or in the backbone's dtype when that is
# wider (float64): kept in bfloat16, an SGD update smaller than 2⁻⁸ of the weight would be rounded away
# (one step at lr 1e-3 changes no LoRA entry). It computes in the dtype of the activations it meets
# (a bfloat16 backbone's, or autocast's), cast at each forward as autocast casts a linear layer's weight:
# the cast is of the small factors, not of the tokens, and its backward hands the gradient to the
# float32 weight. On a float32 backbone without autocast every cast is the tensor itself.

def trained_dtype(backbone_dtype: torch.dtype) -> torch.dtype:
    """The dtype of weights trained beside a backbone of ``backbone_dtype``: float32, or the backbone's if wider."""
    return torch.promote_types(backbone_dtype, torch.float32)


# --------------------------------------------------------------------------------------------------
# A mixed batch sorted by expert: one contiguous run of samples per expert.
#
# Routing sends each sample of a batch to its own expert. Sorting the batch by
# expert turns that into a few contiguous runs, so every layer computes one
# expert per run on a slice of the batch (no gather or scatter per layer).

# (expert, run of samples) pairs covering a batch sorted by expert, in batch order.
Segments = list[tuple[int, slice]]
# What a forward computes with: None (the bare backbone), one expert, runs of a sorted batch, or a
# (batch,) tensor of one expert per sample in any order (for kernels that gather each sample's expert).
ExpertSelection = Optional[Union[int, Segments, Tensor]]


# --------------------------------------------------------------------------------------------------
# The experts: one QVLoRA per layer and expert, in the QKVExperts that replaces the layer.
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


def fused_qkv_width(base_layer: nn.Linear) -> int:
    """The width d of each of q, k and v in a fused qkv projection, whose output is ``[q | k | v]``
    (3*d features); any other layer is refused, naming ``base_layer``."""
    if base_layer.out_features % 3:
        raise ValueError(f"base_layer must be a fused qkv projection with 3*d outputs, "
                         f"got out_features={base_layer.out_features}")
    return base_layer.out_features // 3


class QKVExperts(nn.Module):
    """A fused qkv linear layer with LoRA experts on its q and v parts.

    Args:
        base_layer: the ``nn.Linear`` to adapt; its output is ``[q | k | v]``.
    """

    def __init__(self, base_layer: nn.Linear) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.head_width = fused_qkv_width(base_layer)
        self.experts = nn.ModuleList()

    @property
    def in_features(self) -> int:
        return self.base_layer.in_features

    def new_expert(self, rank: int, alpha: float) -> QVLoRA:
        """A new expert for this layer (on its device), not yet added: float32 on a bfloat16 or float16 layer
        (see :func:`trained_dtype`), else in the layer's dtype."""
        weight = self.base_layer.weight
        return QVLoRA(self.in_features, self.head_width, rank, alpha).to(device=weight.device,
                                                                        dtype=trained_dtype(weight.dtype))

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
        # A and B are float32 (see trained_dtype); a custom Function gets one dtype: the tokens', or autocast's.
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


# --------------------------------------------------------------------------------------------------
# The q and v low-rank update as kernels: added in place onto a fused qkv output (``_add_qv_update_``), and
# ``linear`` plus that update with a backward that computes only what is needed (:class:`QVLowRankLinear`).

def _add_qv_update_(out: Tensor, low: Tensor, B: Tensor, scaling: float) -> None:
    """``out[:, q] += s low_q B_q^T`` and ``out[:, v] += s low_v B_v^T``, in place on 2-d ``out``."""
    d, r = B.shape[1], B.shape[2]
    out[:, :d].addmm_(low[:, :r], B[0].T, alpha=scaling)
    out[:, 2 * d :].addmm_(low[:, r:], B[1].T, alpha=scaling)


class QVLowRankLinear(torch.autograd.Function):
    """``linear(x, W, b)`` plus the q and v LoRA updates, with a backward that does only what is needed.

    Forward: the frozen matmul, then ``x A^T`` (both parts in one matmul) and one
    thin matmul per part added in place onto the q and v columns of the output.
    Backward, with ``g`` the output gradient and ``g_q``, ``g_v`` its q and v columns
    (views): ``dlow = s [g_q B_q | g_v B_v]``, ``dx = g W + dlow A`` (one addmm),
    ``dA = dlow^T x``, ``dB = s g^T low``; ``W`` and ``b`` get gradients only if
    they require them (a frozen backbone's do not). Autograd through the plain
    composition would instead multiply by the zero key block of a fused
    ``[B_q 0; 0 0; 0 B_v]`` in both directions.
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, A: Tensor, B: Tensor, scaling: float) -> Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        out = nn.functional.linear(x2, weight, bias)
        low = x2 @ A.reshape(-1, A.shape[-1]).T
        _add_qv_update_(out, low, B, scaling)
        ctx.save_for_backward(x2, weight, A, B, low)
        ctx.scaling = scaling
        ctx.has_bias = bias is not None
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        x2, weight, A, B, low = ctx.saved_tensors
        s = ctx.scaling
        d, r = B.shape[1], B.shape[2]
        g = grad.reshape(-1, grad.shape[-1])
        g_q, g_v = g[:, :d], g[:, 2 * d :]
        need_x, need_w, need_b, need_a, need_b_lora = ctx.needs_input_grad[:5]
        dx = dw = db = da = dB = None
        if need_x or need_a:
            dlow = torch.cat((g_q @ B[0], g_v @ B[1]), dim=1).mul_(s)
            A2 = A.reshape(2 * r, -1)
            if need_x:
                dx = torch.addmm(g @ weight, dlow, A2).view(*grad.shape[:-1], x2.shape[-1])
            if need_a:
                da = (dlow.T @ x2).view(A.shape)
        if need_b_lora:
            dB = torch.stack((g_q.T @ low[:, :r], g_v.T @ low[:, r:])).mul_(s)
        if need_w:
            dw = g.T @ x2
        if need_b and ctx.has_bias:
            db = g.sum(0)
        return dx, dw, db, da, dB, None


# --------------------------------------------------------------------------------------------------
# Per-expert weights stacked on a first axis, for kernels that gather each sample's expert.
#
# A batch that mixes experts can be computed with fixed shapes and no host sync when every
# expert's weights sit in one tensor: each sample's factors are gathered by its expert index.
# Stacking copies the weights (one kernel per stack), so the stacks are cached and built again
# only when a source tensor changes: written in place (its version counter moves), moved or cast
# (its storage or dtype changes), or experts are added. The expert that trains changes at every
# step: its slot is taken live from its parameters at each forward (:func:`with_live_slot`), so
# gradients reach it and the cache need not follow it.

# owner module -> (key of the sources the stacks were built from, the stacks). Weak: a deleted or
# copied model never finds another's stacks. A decision: kept beside the modules, not on them, so that
# a model's deepcopy, pickle and state_dict never carry a copy of every expert's weights; and keyed on
# the tensors' version counter (``_version``, private but what autograd itself checks in-place writes
# by), the one signal torch gives that a tensor was written in place.
_STACKS: WeakKeyDictionary[nn.Module, tuple[tuple, tuple[Tensor, ...]]] = WeakKeyDictionary()

SourceKey = tuple


def source_key(tensors: Sequence[Tensor], *extra: object) -> SourceKey:
    """What identifies the current values of ``tensors``: storage, version counter, dtype and device."""
    return (*extra, *((t.data_ptr(), t._version, t.dtype, t.device) for t in tensors))


def cached_stacks(owner: nn.Module, key: SourceKey, build: Callable[[], tuple[Tensor, ...]]) -> tuple[Tensor, ...]:
    """``build()``'s tensors (built without gradients), built again only when ``key`` differs from last time."""
    cached = _STACKS.get(owner)
    if cached is not None and cached[0] == key:
        return cached[1]
    # Plain tensors even when first built under inference mode: a later forward with gradients may use them.
    with torch.inference_mode(False), torch.no_grad():
        stacks = build()
    _STACKS[owner] = (key, stacks)
    return stacks


def with_live_slot(stack: Tensor, index: Optional[int], live: Tensor) -> Tensor:
    """``stack`` with slot ``index`` replaced by ``live`` (differentiable in ``live``); ``stack`` itself if
    ``index`` is None. Slices with Python ints: no index tensor, so nothing is copied from the host."""
    if index is None:
        return stack
    return torch.cat((stack[:index], live.unsqueeze(0).to(stack.dtype), stack[index + 1 :]))


def pad_dim(t: Tensor, dim: int, size: int) -> Tensor:
    """``t`` zero-padded at the end of ``dim`` to ``size`` (zeros add exactly nothing to a product)."""
    missing = size - t.shape[dim]
    if missing == 0:
        return t
    pad = [0, 0] * (t.dim() - dim % t.dim() - 1) + [0, missing]
    return nn.functional.pad(t, pad)


# --------------------------------------------------------------------------------------------------
# timm's ViT forward with the experts passed to every qkv layer as an argument.
#
# timm's ``Block`` and ``Attention`` call ``attn.qkv(x)`` with the tokens only, so the experts
# of a forward could reach the LoRA layers only as state set beforehand. These functions
# compute what ``VisionTransformer.forward_features`` computes for timm's ``Block`` and
# ``Attention`` (timm 1.0), and call each block's
# :class:`QKVExperts` as ``qkv(x, experts)``. The tests
# check them bit-identical to timm's own forward without experts, and equal to a ViT with
# an expert's update merged into its weights. The LoRA-sum peers and CL-LoRA run the same forward
# with their own qkv layers, so ``experts`` is whatever the model's qkv layers take per forward
# (CoLoR's :data:`ExpertSelection`, the peers' mixing or update), handed on unread: ``object``.

def expert_tokens(vit: VisionTransformer, x: Tensor, experts: object,
                  trained: Optional[int] = None) -> Tensor:
    """The ViT's output tokens (after the final norm), every qkv layer computing with ``experts``
    (``trained``: the expert that trains, see :meth:`QKVExperts.forward`)."""
    tokens = vit.norm_pre(vit.patch_drop(vit._pos_embed(vit.patch_embed(x))))
    for block in vit.blocks:
        tokens = block_forward(block, tokens, experts, trained)
    return vit.norm(tokens)


def block_forward(block: Block, x: Tensor, experts: object, trained: Optional[int] = None) -> Tensor:
    """timm's ``Block.forward`` (no attention mask), with ``experts`` given to the qkv layer."""
    x = x + block.drop_path1(block.ls1(attention_forward(block.attn, block.norm1(x), experts, trained)))
    return x + block.drop_path2(block.ls2(block.mlp(block.norm2(x))))


def attention_forward(attn: Attention, x: Tensor, experts: object, trained: Optional[int] = None) -> Tensor:
    """timm's ``Attention.forward`` (no attention mask), with ``experts`` given to the qkv layer."""
    batch, tokens, _ = x.shape
    gate = getattr(attn, "gate", None)  # timm >= 1.0.20: an optional sigmoid gate
    gate = gate(x).sigmoid() if gate is not None else None
    # Other qkv layers (the LoRA-sum peers') take only the per-forward argument: ``trained`` is CoLoR's.
    projected = attn.qkv(x, experts) if trained is None else attn.qkv(x, experts, trained)
    qkv = projected.reshape(batch, tokens, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    q, k = attn.q_norm(q), attn.k_norm(k)
    if attn.fused_attn:
        x = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, dropout_p=attn.attn_drop.p if attn.training else 0.0)
    else:
        weights = (q * attn.scale) @ k.transpose(-2, -1)
        x = attn.attn_drop(weights.softmax(dim=-1)) @ v
    x = attn.norm(x.transpose(1, 2).reshape(batch, tokens, attn.num_heads * attn.head_dim))  # no -1: an empty batch too
    if gate is not None:
        x = x * gate
    return attn.proj_drop(attn.proj(x))
