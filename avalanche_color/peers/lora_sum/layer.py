"""A fused qkv layer with a sum of LoRA components on two of its q, k, v parts (SD-LoRA, InfLoRA).

Both methods adapt one shared ViT for every experience: each experience adds a
component (rank-r ``A`` and ``B`` per adapted part) and the layer computes

    qkv(x) = W0 x + sum_i c_i B_i A_i x   on the adapted parts (q and v, or k and v),

with a coefficient ``c_i`` per component given by the caller (:class:`Mixing`): SD-LoRA's
magnitude over the direction's norm, InfLoRA's 1. Each component's weights are a
:class:`~avalanche_color.lora.QVLoRA` (A Kaiming-uniform, B zeros, scaling 1):
its index 0 belongs to the first adapted part, index 1 to the second.

Which components run low-rank is an argument (:attr:`Mixing.low_rank`: those whose factors train);
every other one is folded into the weight (one matmul, a d x r x d product per component and
forward, nothing per sample; gradients still reach its coefficient through the fold). Nothing is
read from ``requires_grad`` or the grad mode, so the same call computes the same way everywhere.

The components are float32 on a bfloat16 or float16 layer (:func:`~avalanche_color.lora.trained_dtype`), so that
SGD's small updates are kept; each forward casts their factors to the dtype they meet (the weight's when
folded, the tokens' when low-rank), as autocast casts a linear layer's weight: on a float32 or float64
layer nothing is cast.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Optional

import torch
from torch import Tensor, nn

from avalanche_color.lora import QVLoRA, trained_dtype

Part = Literal["q", "k", "v"]
PARTS: tuple[str, ...] = ("q", "k", "v")
DirectionNorm = Literal["factors", "product"]


@dataclass(frozen=True)
class Mixing:
    """How the components of one forward are weighted.

    Attributes:
        magnitudes: one scalar per component (SD-LoRA's alpha_i); None: every coefficient is 1 (InfLoRA).
        normalised: per component, whether its update is divided by its norm (SD-LoRA's finished directions).
        norm: ``"factors"``: ``||B||_F ||A||_F`` (the SD-LoRA code); ``"product"``: ``||B A||_F`` (its paper).
        low_rank: the components that run low-rank, down and up (those whose A or B train: what their
            gradients need); the others are folded into the weight.
    """

    magnitudes: Optional[Sequence[Tensor]] = None
    normalised: Sequence[bool] = ()
    norm: DirectionNorm = "factors"
    low_rank: frozenset[int] = frozenset()


def direction_norm(A: Tensor, B: Tensor, norm: DirectionNorm) -> Tensor:
    """``||B A||_F`` (without forming the d x d product) or ``||B||_F ||A||_F``, in at least float32
    (sums of squares under- and overflow in half precision)."""
    dtype = torch.promote_types(A.dtype, torch.float32)
    A, B = A.to(dtype), B.to(dtype)
    if norm == "factors":
        return torch.linalg.matrix_norm(B) * torch.linalg.matrix_norm(A)
    # ||BA||_F^2 = trace(A^T B^T B A) = sum((A A^T) * (B^T B)), all r x r.
    return ((A @ A.T) * (B.T @ B)).sum().clamp_min(0).sqrt()


class LoRASumQKV(nn.Module):
    """One timm ``attn.qkv`` with a growing list of LoRA components on two of its parts.

    Args:
        base_layer: the fused ``nn.Linear`` whose output is ``[q | k | v]``; it stays frozen.
        parts: the two adapted parts, e.g. ``("q", "v")`` (SD-LoRA) or ``("k", "v")`` (InfLoRA).
    """

    def __init__(self, base_layer: nn.Linear, parts: tuple[Part, Part]) -> None:
        super().__init__()
        if base_layer.out_features % 3:
            raise ValueError(f"base_layer must be a fused qkv projection with 3*d outputs, "
                             f"got out_features={base_layer.out_features}")
        self.base_layer = base_layer
        self.width = base_layer.out_features // 3
        self.parts = tuple(PARTS.index(part) for part in parts)
        self.components = nn.ModuleList()

    @property
    def in_features(self) -> int:
        return self.base_layer.in_features

    def add_component(self, rank: int) -> QVLoRA:
        """A new component (B zeros: the layer's output is unchanged), on the layer's device: float32 on a
        bfloat16 or float16 layer (see :func:`~avalanche_color.lora.trained_dtype`), else in the layer's dtype."""
        weight = self.base_layer.weight
        component = QVLoRA(self.in_features, self.width, rank, alpha=rank).to(weight.device,
                                                                              trained_dtype(weight.dtype))
        self.components.append(component)
        return component

    def coefficients(self, mixing: Mixing) -> list[list[Tensor]]:
        """Per adapted part, each component's coefficient ``c_i`` (0-d tensors, in at least float32:
        ``alpha / ||B A||`` of a small direction overflows half precision)."""
        ones = [self.base_layer.weight.new_ones((), dtype=torch.float32) for _ in self.components]
        magnitudes = ones if mixing.magnitudes is None else list(mixing.magnitudes)
        result = []
        for index in range(2):
            row = []
            for i, component in enumerate(self.components):
                c = magnitudes[i].to(torch.promote_types(magnitudes[i].dtype, torch.float32))
                if i < len(mixing.normalised) and mixing.normalised[i]:
                    norm = direction_norm(component.A[index], component.B[index], mixing.norm).to(c.dtype)
                    # A direction that learned nothing (B = 0: an experience stopped before its first step,
                    # as early stopping may leave it) adds nothing, rather than 0 / 0 = NaN everywhere.
                    c = torch.where(norm > 0, c / torch.where(norm > 0, norm, torch.ones_like(norm)), 0.0)
                row.append(c)
            result.append(row)
        return result

    def forward(self, x: Tensor, mixing: Optional[Mixing] = None) -> Tensor:
        """``[q | k | v]`` of ``x`` plus every component's update on the adapted parts.

        The components named in ``mixing.low_rank`` run low-rank, down and up (what the gradients of
        trained factors need); the others are folded into the weight, one matmul for all.
        """
        if not len(self.components):
            return self.base_layer(x)
        mixing = mixing or Mixing()
        coefficients = self.coefficients(mixing)
        frozen = [i for i in range(len(self.components)) if i not in mixing.low_rank]
        weight = self.base_layer.weight
        if frozen:
            parts = list(weight.split(self.width))
            for index, part in enumerate(self.parts):
                down = torch.cat([self.components[i].A[index] for i in frozen]).to(weight.dtype)
                parts[part] = parts[part] + self._scaled_up(coefficients[index], frozen, index, weight.dtype) @ down
            weight = torch.cat(parts)
        out = nn.functional.linear(x, weight, self.base_layer.bias)
        training = [i for i in range(len(self.components)) if i not in frozen]
        if not training:
            return out
        pieces = list(out.split(self.width, dim=-1))
        for index, part in enumerate(self.parts):
            down = torch.cat([self.components[i].A[index] for i in training]).to(x.dtype)  # (sum r_i, in)
            pieces[part] = pieces[part] + (x @ down.T) @ self._scaled_up(coefficients[index], training, index,
                                                                         x.dtype).T
        return torch.cat(pieces, dim=-1)

    def _scaled_up(self, coefficients: list[Tensor], components: list[int], index: int, dtype: torch.dtype) -> Tensor:
        """(out, sum r_i): the components' B of part ``index``, each times its coefficient (in float32 or wider,
        and never narrower than B: a float64 B is not rounded to a float32 coefficient's precision)."""
        scaled = []
        for i in components:
            B = self.components[i].B[index]
            wide = torch.promote_types(coefficients[i].dtype, B.dtype)
            scaled.append((coefficients[i].to(wide) * B.to(wide)).to(dtype))
        return torch.cat(scaled, dim=1)

    def delta_weight(self, component: int, mixing: Optional[Mixing] = None) -> Tensor:
        """(2, out, in): one component's weighted update of the two adapted parts (for tests and analysis)."""
        c = self.components[component]
        coefficients = self.coefficients(mixing or Mixing())
        return torch.stack([(coefficients[i][component] * c.B[i].to(torch.float64)).to(c.A.dtype) @ c.A[i]
                            for i in range(2)])
