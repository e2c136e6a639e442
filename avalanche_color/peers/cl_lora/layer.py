"""A fused qkv layer with one LoRA update on q and v, chosen by the caller per forward (CL-LoRA).

The authors' ``Attention_lora`` adds ``w_q U_q D_q x`` to q and ``w_v U_v D_v x`` to v, where x is the
block's ``norm1`` output, D (r x d) the down and U (d x r) the up projection, no scaling, k untouched.
Unlike SD-LoRA and InfLoRA nothing is summed: each forward runs one adapter per block (the shared
one, its distillation teacher's, or one experience's task-specific one), so the layer holds no
adapter; the model passes it a :class:`QVUpdate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class QVUpdate:
    """The update of one forward: index 0 is q, index 1 is v.

    Attributes:
        down: (2, r, d), D.
        up: (2, d, r), U.
        weights: (2,), the block weights of q and v (a task-specific block); None: 1 (a shared block).
    """

    down: Tensor
    up: Tensor
    weights: Optional[Tensor] = None


def orthonormal_down(width: int, rank: int, generator: torch.Generator) -> Tensor:
    """(rank, width) ``Qᵀ`` of the reduced QR of a uniform [0, 1) (width x rank) matrix (the code's
    ``Adapter_lora`` init; rows orthonormal, not Haar-distributed). Drawn in float32, the QR in float64."""
    q, _ = torch.linalg.qr(torch.rand(width, rank, generator=generator).double())
    return q.T.contiguous()


class QVAdapter(nn.Module):
    """One block's LoRA on q and v: ``down`` (2, r, d) orthonormal rows per part, ``up`` (2, d, r) zeros
    (a new adapter changes nothing). The generator draws q's D, then v's."""

    def __init__(self, width: int, rank: int, generator: torch.Generator, like: Tensor) -> None:
        super().__init__()
        down = torch.stack([orthonormal_down(width, rank, generator) for _ in range(2)])
        self.down = nn.Parameter(down.to(like.device, like.dtype))
        self.up = nn.Parameter(like.new_zeros(2, width, rank))


class CLLoRAQKV(nn.Module):
    """One timm ``attn.qkv`` (kept frozen as ``base_layer``) plus the update it is given.

    Args:
        base_layer: the fused ``nn.Linear`` whose output is ``[q | k | v]``.
    """

    def __init__(self, base_layer: nn.Linear) -> None:
        super().__init__()
        if base_layer.out_features % 3:
            raise ValueError(f"base_layer must be a fused qkv projection with 3*d outputs, "
                             f"got out_features={base_layer.out_features}")
        self.base_layer = base_layer
        self.width = base_layer.out_features // 3

    @property
    def in_features(self) -> int:
        return self.base_layer.in_features

    def forward(self, x: Tensor, update: Optional[QVUpdate] = None) -> Tensor:
        """``[q + w_q U_q D_q x | k | v + w_v U_v D_v x]``; ``[q | k | v]`` without an update."""
        out = self.base_layer(x)
        if update is None:
            return out
        q, k, v = out.split(self.width, dim=-1)
        # The float32 factors computed in the tokens' dtype (a bfloat16 ViT's), as autocast casts a weight.
        low = [(x @ update.down[i].T.to(x.dtype)) @ update.up[i].T.to(x.dtype) for i in range(2)]
        if update.weights is not None:
            low = [update.weights[i].to(x.dtype) * low[i] for i in range(2)]
        return torch.cat((q + low[0], k, v + low[1]), dim=-1)
