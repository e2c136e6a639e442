"""One way to get a backbone: a timm name, a local checkpoint file, or the offline backbone.

    load_backbone("vit_base_patch16_224.augreg_in21k")       # timm, downloads the weights
    load_backbone("path/to/checkpoint.pt")                   # a file written by save_backbone
    load_backbone("path/to/weights.pth", architecture="vit_base_patch16_224")  # a plain state_dict
    load_backbone("offline")                                 # the package's Tiny-ImageNet-100 ViT
    load_backbone("digits")                                  # the package's digits ViT (the main job's)

The two small ViTs ship with the package (:mod:`avalanche_color.backbones`), so an installed
``avalanche_color`` has them too; ``pretrain.py`` and ``pretrain_digits.py`` here make them.

Every backbone comes without a classifier head (``num_classes=0``): CoLoR adds its own heads
and the baselines get theirs from :func:`with_head`. ``data_config`` gives the input size and
normalisation the backbone was pretrained with, from timm's ``pretrained_cfg``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import timm
import torch
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from avalanche_color.backbones import FILES, backbone_from_checkpoint, is_backbone_checkpoint, save_backbone

# The small backbones ship with the package (avalanche_color/backbones/); these scripts make them.
OFFLINE_BACKBONE, DIGITS_BACKBONE = FILES["offline"], FILES["digits"]
COMMITTED = {"offline": (OFFLINE_BACKBONE, "python -m benchmarks.backbones.pretrain"),
             "digits": (DIGITS_BACKBONE, "python -m benchmarks.backbones.pretrain_digits")}
__all__ = ["COMMITTED", "DIGITS_BACKBONE", "OFFLINE_BACKBONE", "data_config", "load_backbone", "save_backbone",
           "with_head"]


def load_backbone(spec: str | Path, *, architecture: str | None = None) -> VisionTransformer:
    """A headless pretrained timm ViT from a timm name or a checkpoint file (see the module doc)."""
    path, command = COMMITTED.get(str(spec), (Path(spec), None))
    if command is not None and not path.is_file():
        raise FileNotFoundError(f"the {spec} backbone {str(path)!r} is missing: run {command}")
    if path.is_file():
        return _from_file(path, architecture)
    if architecture is not None:
        raise FileNotFoundError(f"checkpoint file {str(spec)!r} does not exist")
    if str(spec) not in timm.list_models(pretrained=True):
        raise ValueError(f"backbone must be a checkpoint file, 'offline' or a pretrained timm model name; "
                         f"got {str(spec)!r}")
    return _vit(timm.create_model(str(spec), pretrained=True, num_classes=0), str(spec))


def _from_file(path: Path, architecture: str | None) -> VisionTransformer:
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if is_backbone_checkpoint(checkpoint):
        return _vit(backbone_from_checkpoint(checkpoint), str(path))
    if architecture is None:
        raise ValueError(f"{str(path)!r} is a plain state_dict: pass architecture= (a timm model name) to build it")
    # timm's own route for local weights: it adapts the head and checks the keys.
    model = timm.create_model(architecture, pretrained=True, num_classes=0,
                              pretrained_cfg_overlay={"file": str(path)})
    return _vit(model, str(path))


def _vit(model: nn.Module, origin: str) -> VisionTransformer:
    if not isinstance(model, VisionTransformer):
        raise TypeError(f"backbone {origin!r} is a {type(model).__name__}, not a timm VisionTransformer")
    return model.eval()


def data_config(model: VisionTransformer) -> dict[str, Any]:
    """Input size, mean and std the backbone expects: timm's resolved data config, its input size
    the model's own (a model built with another ``img_size`` keeps its architecture's cfg)."""
    config = timm.data.resolve_data_config(model=model)
    return {**config, "input_size": (model.patch_embed.proj.in_channels, *model.patch_embed.img_size)}


def with_head(backbone: VisionTransformer, num_classes: int) -> VisionTransformer:
    """The backbone with a fresh linear classifier over ``num_classes`` (for the baselines)."""
    backbone.reset_classifier(num_classes)
    return backbone
