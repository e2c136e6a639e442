"""Weights on both sides: the seeded ViT both start from, a LoRA component copied from ours into theirs, and
read from either side in one layout."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor

from benchmarks.side_by_side.lora_sub.authors_code import their_attention


def tiny_vit(sizes: SimpleNamespace) -> VisionTransformer:
    torch.manual_seed(sizes.seed)
    return VisionTransformer(img_size=sizes.image, patch_size=sizes.patch, embed_dim=sizes.width, depth=sizes.depth,
                             num_heads=sizes.heads, num_classes=0, global_pool="token").double().eval()


@torch.no_grad()
def copy_component(state: dict[str, Tensor], net: Any, t: int) -> None:
    """Our component t (from a state dict of our model) into their ``lora_{A,B}_{k,v}[t]``."""
    for block, attn in enumerate(their_attention(net)):
        prefix = f"backbone.blocks.{block}.attn.qkv.components.{t}."
        for index, part in enumerate("kv"):
            getattr(attn, f"lora_A_{part}")[t].weight.copy_(state[prefix + "A"][index])
            getattr(attn, f"lora_B_{part}")[t].weight.copy_(state[prefix + "B"][index])


def their_component(net: Any, t: int) -> list[Tensor]:
    """A of k and v, B of k and v, per block, stacked as ours (2, r, d) and (2, d, r)."""
    out = []
    for attn in their_attention(net):
        out.append(torch.stack([attn.lora_A_k[t].weight, attn.lora_A_v[t].weight]).detach().clone())
        out.append(torch.stack([attn.lora_B_k[t].weight, attn.lora_B_v[t].weight]).detach().clone())
    return out


def our_component(state: dict[str, Tensor], t: int, depth: int) -> list[Tensor]:
    return [state[f"backbone.blocks.{b}.attn.qkv.components.{t}.{f}"] for b in range(depth) for f in "AB"]
