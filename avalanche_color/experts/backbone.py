"""What the frozen backbone must be: a timm VisionTransformer, and images it can take."""

from __future__ import annotations

from typing import Any

import torch
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor, nn


def check_vision_transformer(model: nn.Module) -> None:
    """Refuse anything but a timm VisionTransformer, naming what was given and how to get one."""
    if isinstance(model, VisionTransformer):
        return
    given = f"{type(model).__module__}.{type(model).__qualname__}"
    hint = ""
    if type(model).__module__.startswith("torchvision"):
        hint = (" torchvision's ViTs have another layout (no fused per-block qkv layer, no "
                "forward_features/forward_head); build the same architecture with timm, e.g. "
                "timm.create_model('vit_base_patch16_224.augreg_in21k', pretrained=True) for torchvision's vit_b_16.")
    raise TypeError(
        f"model must be a timm.models.vision_transformer.VisionTransformer "
        f"(e.g. timm.create_model('vit_base_patch16_224')), got {given}.{hint}"
    )


def backbone_dtype(vit: VisionTransformer) -> torch.dtype:
    """The floating dtype the ViT computes in: that of its patch embedding's weights."""
    return vit.patch_embed.proj.weight.dtype


def backbone_images(vit: VisionTransformer, x: Tensor) -> Tensor:
    """``x`` in the backbone's dtype, or a ``ValueError`` naming what the patch embedding expects.

    Integer images (uint8 0-255, ...) are refused, not converted: their scale is unknown here,
    and the backbone expects its own normalisation. Floating images of another precision
    (float64 images on a float32 ViT, float32 on a bfloat16 one) are converted: this is the
    one place images enter the backbone.
    """
    if not x.is_floating_point():
        raise ValueError(
            f"images must be a floating-point tensor, normalised as the backbone expects (e.g. "
            f"torchvision's ToTensor then Normalize with the mean and std of "
            f"timm.data.resolve_data_config({{}}, model=vit)), got dtype {x.dtype}"
        )
    embed = vit.patch_embed
    channels = embed.proj.in_channels
    expected = f"(batch, {channels}, {embed.img_size[0]}, {embed.img_size[1]})"
    if x.dim() != 4 or x.shape[1] != channels:
        raise ValueError(f"images must have shape {expected}, got {tuple(x.shape)}")
    size = tuple(x.shape[-2:])
    if getattr(embed, "strict_img_size", True) and size != tuple(embed.img_size):
        raise ValueError(f"images must have shape {expected}, got {tuple(x.shape)}")
    patch = tuple(embed.patch_size)
    if not getattr(embed, "dynamic_img_pad", False) and (size[0] % patch[0] or size[1] % patch[1]):
        raise ValueError(f"image height and width must be multiples of the patch size {patch}, got {size}")
    return x.to(embed.proj.weight.dtype)


def check_experience_images(vit: VisionTransformer, experience: Any) -> None:
    """Refuse a training experience with no samples, or whose first image ``vit`` cannot take
    (:func:`backbone_images`): called before a model changes any state for the experience."""
    if len(experience.dataset) == 0:
        raise ValueError(f"experience {experience.current_experience} has no samples")
    backbone_images(vit, torch.as_tensor(experience.dataset[0][0]).unsqueeze(0))
