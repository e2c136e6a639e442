"""Prompt tokens in a timm ViT's token sequence (prompt tuning, as in S-Prompts and L2P).

Prompts enter a frozen ViT only as extra tokens: after the patch embedding and
positional embedding, the prompts are inserted right behind the prefix tokens
([CLS] and any register tokens) and the sequence goes through the blocks.
Prompts get no positional embedding, so the image tokens the blocks see are
exactly the backbone's; the prompts act only through attention. With zero
prompts the computation is the backbone's. This is what S-Prompts' code and
L2P's authors' code do (L2P's ``models/vit.py`` prepends the prompts inside its
``Encoder``, after ``AddPositionEmbs`` added the positions of [CLS] and the
patches); the PyTorch ports of L2P (l2p-pytorch, Avalanche's ``LearningToPrompt``)
instead give every prompt token the [CLS] token's position embedding when they
load pretrained weights (``resize_pos_embed`` in Avalanche's ``timm_vit.py``).

Works for any timm ``VisionTransformer``: width, depth, image size and the
number of prefix tokens are read from the model.
"""

from __future__ import annotations

import math

import torch
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor, nn


def prompt_width(vit: VisionTransformer) -> int:
    """The width of the ViT's tokens, which prompts must have."""
    return int(vit.embed_dim)


def new_prompts(count: int, width: int, bound: float) -> nn.Parameter:
    """``count`` learnable prompt tokens, uniform in [-bound, bound]."""
    return nn.Parameter(torch.empty(count, width).uniform_(-bound, bound))


def s_prompts_bound(width: int) -> float:
    """S-Prompts' prompt initialisation: its prompts are an ``nn.Linear`` weight, U(+-1/sqrt(width))."""
    return 1 / math.sqrt(width)


def prompted_tokens(vit: VisionTransformer, x: Tensor, prompts: Tensor) -> Tensor:
    """The ViT's output tokens (after the final norm) with ``prompts`` in the sequence.

    Args:
        vit: a timm ``VisionTransformer``.
        x: images (batch, channels, height, width).
        prompts: (count, width) prompts shared by the batch, or (batch, count, width)
            prompts per sample.

    Returns:
        (batch, prefix + count + patches, width): prefix tokens, prompt tokens,
        patch tokens, in that order (see :func:`drop_prompts`).
    """
    tokens = vit._pos_embed(vit.patch_embed(x))  # prefix tokens + patches, positions added
    tokens = insert_prompts(tokens, prompts, vit.num_prefix_tokens)
    tokens = vit.norm_pre(vit.patch_drop(tokens))
    return vit.norm(vit.blocks(tokens))


def insert_prompts(tokens: Tensor, prompts: Tensor, num_prefix_tokens: int) -> Tensor:
    """``tokens`` (batch, n, width) with ``prompts`` inserted behind the prefix tokens."""
    batch, width = tokens.shape[0], tokens.shape[2]
    if not (prompts.dim() == 2 and prompts.shape[1] == width
            or prompts.dim() == 3 and prompts.shape[0] == batch and prompts.shape[2] == width):
        raise ValueError(
            f"prompts must have shape (count, {width}) or ({batch}, count, {width}), got {tuple(prompts.shape)}"
        )
    if prompts.shape[-2] == 0:  # the very tensor: even its memory layout stays the backbone's
        return tokens
    if prompts.dim() == 2:
        prompts = prompts.unsqueeze(0).expand(batch, -1, -1)
    prompts = prompts.to(tokens.dtype)
    return torch.cat((tokens[:, :num_prefix_tokens], prompts, tokens[:, num_prefix_tokens:]), dim=1)


def prompt_outputs(tokens: Tensor, count: int, num_prefix_tokens: int) -> Tensor:
    """The (batch, count, width) outputs at the prompt positions of :func:`prompted_tokens`."""
    return tokens[:, num_prefix_tokens : num_prefix_tokens + count]


def drop_prompts(tokens: Tensor, count: int, num_prefix_tokens: int) -> Tensor:
    """The output tokens without the ``count`` prompt positions: the backbone's layout again.

    The ViT's own pooling (``forward_head``) then reads the positions it reads
    without prompts: [CLS] for token pooling, the patch tokens for average pooling.
    """
    if count == 0:  # the very tensor, so pooling reduces it exactly as without prompts
        return tokens
    return torch.cat((tokens[:, :num_prefix_tokens], tokens[:, num_prefix_tokens + count :]), dim=1)


def prompted_features(vit: VisionTransformer, x: Tensor, prompts: Tensor) -> Tensor:
    """The ViT's pooled features (``forward_head(pre_logits=True)``) with ``prompts`` in the sequence."""
    tokens = prompted_tokens(vit, x, prompts)
    return vit.forward_head(drop_prompts(tokens, prompts.shape[-2], vit.num_prefix_tokens), pre_logits=True)
