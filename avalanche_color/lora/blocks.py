"""timm's ViT forward with the experts passed to every qkv layer as an argument.

timm's ``Block`` and ``Attention`` call ``attn.qkv(x)`` with the tokens only, so the experts
of a forward could reach the LoRA layers only as state set beforehand. These functions
compute what ``VisionTransformer.forward_features`` computes for timm's ``Block`` and
``Attention`` (timm 1.0), and call each block's
:class:`~avalanche_color.lora.qv_experts.QKVExperts` as ``qkv(x, experts)``. The tests
check them bit-identical to timm's own forward without experts, and equal to a ViT with
an expert's update merged into its weights.
"""

from __future__ import annotations

from typing import Optional

import torch
from timm.models.vision_transformer import Attention, Block, VisionTransformer
from torch import Tensor

from avalanche_color.lora.segments import ExpertSelection


def expert_tokens(vit: VisionTransformer, x: Tensor, experts: ExpertSelection,
                  trained: Optional[int] = None) -> Tensor:
    """The ViT's output tokens (after the final norm), every qkv layer computing with ``experts``
    (``trained``: the expert that trains, see :meth:`QKVExperts.forward`)."""
    tokens = vit.norm_pre(vit.patch_drop(vit._pos_embed(vit.patch_embed(x))))
    for block in vit.blocks:
        tokens = block_forward(block, tokens, experts, trained)
    return vit.norm(tokens)


def block_forward(block: Block, x: Tensor, experts: ExpertSelection, trained: Optional[int] = None) -> Tensor:
    """timm's ``Block.forward`` (no attention mask), with ``experts`` given to the qkv layer."""
    x = x + block.drop_path1(block.ls1(attention_forward(block.attn, block.norm1(x), experts, trained)))
    return x + block.drop_path2(block.ls2(block.mlp(block.norm2(x))))


def attention_forward(attn: Attention, x: Tensor, experts: ExpertSelection, trained: Optional[int] = None) -> Tensor:
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
