"""One way to get a backbone: a timm name, a local checkpoint file, or the offline backbone.

    load_backbone("vit_base_patch16_224.augreg_in21k")       # timm, downloads the weights
    load_backbone("path/to/checkpoint.pt")                   # a file written by save_backbone
    load_backbone("path/to/weights.pth", architecture="vit_base_patch16_224")  # a plain state_dict
    load_backbone("offline")                                 # the committed Tiny-ImageNet-100 ViT
    load_backbone("digits")                                  # the committed digits ViT (the main job's)

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

from avalanche_color.utils.files import torch_save_atomically

OFFLINE_BACKBONE = Path(__file__).parent / "vit_tinyimagenet100_32px.pt"
DIGITS_BACKBONE = Path(__file__).parent / "vit_digits_16px.pt"
# The committed backbones by name, with the command that makes each.
COMMITTED = {"offline": (OFFLINE_BACKBONE, "python -m benchmarks.backbones.pretrain"),
             "digits": (DIGITS_BACKBONE, "python -m benchmarks.backbones.pretrain_digits")}
CHECKPOINT_FORMAT = 1


def save_backbone(model: VisionTransformer, path: Path, *, architecture: str, model_kwargs: dict[str, Any],
                  extra: dict[str, Any] | None = None) -> None:
    """Writes a headless timm ViT with what is needed to rebuild it (atomically)."""
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("head.")}
    checkpoint = {
        "format": CHECKPOINT_FORMAT,
        "architecture": architecture,
        "model_kwargs": model_kwargs,
        # The registered architecture's cfg names its own input size; the model may be resized.
        "pretrained_cfg": {"mean": tuple(model.pretrained_cfg["mean"]), "std": tuple(model.pretrained_cfg["std"]),
                           "input_size": (model.patch_embed.proj.in_channels, *model.patch_embed.img_size)},
        "state_dict": state,
        **(extra or {}),
    }
    torch_save_atomically(checkpoint, path)


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
    if isinstance(checkpoint, dict) and checkpoint.get("format") == CHECKPOINT_FORMAT:
        model = timm.create_model(checkpoint["architecture"], pretrained=False, num_classes=0,
                                  **checkpoint["model_kwargs"])
        model.load_state_dict(checkpoint["state_dict"])
        model.pretrained_cfg = {**model.pretrained_cfg, **checkpoint["pretrained_cfg"]}
        return _vit(model, str(path))
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
    """Input size, mean and std the backbone expects (timm's resolved data config)."""
    return timm.data.resolve_data_config(model=model)


def with_head(backbone: VisionTransformer, num_classes: int) -> VisionTransformer:
    """The backbone with a fresh linear classifier over ``num_classes`` (for the baselines)."""
    backbone.reset_classifier(num_classes)
    return backbone
