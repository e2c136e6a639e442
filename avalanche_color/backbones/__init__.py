"""Two small pretrained ViTs that ship with the package, and the file format they are stored in.

For trying things offline, where no pretrained weights can be downloaded (use a real
pretrained timm ViT for real work)::

    from avalanche_color.backbones import offline_backbone
    vit = offline_backbone("digits")     # 16 px, 4 blocks x 64, pretrained on held-out scikit-learn digits
    vit = offline_backbone("offline")    # 32 px, 4 blocks x 96, pretrained on Tiny-ImageNet classes 0-99

Both are timm ``VisionTransformer`` s without a classifier head, their input size and
normalisation in ``pretrained_cfg``. How each was made: the repository's
``benchmarks/backbones/README.md`` (``python -m benchmarks.backbones.pretrain`` and
``pretrain_digits`` make them again). A file holds the timm architecture name, the keyword
arguments it was resized with, the normalisation and the weights (:func:`save_backbone`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import timm
import torch
from timm.models.vision_transformer import VisionTransformer

from avalanche_color.utils.files import torch_save_atomically

OfflineBackbone = Literal["offline", "digits"]
FILES: dict[str, Path] = {"offline": Path(__file__).parent / "vit_tinyimagenet100_32px.pt",
                          "digits": Path(__file__).parent / "vit_digits_16px.pt"}
CHECKPOINT_FORMAT = 1


def offline_backbone(name: OfflineBackbone = "offline") -> VisionTransformer:
    """One of the package's small pretrained ViTs, in eval mode, without a head."""
    if name not in FILES:
        raise ValueError(f"name must be one of {tuple(FILES)}, got {name!r}")
    return read_backbone(FILES[name])


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


def read_backbone(path: Path) -> VisionTransformer:
    """The ViT a :func:`save_backbone` file holds, in eval mode."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if not is_backbone_checkpoint(checkpoint):
        raise ValueError(f"{str(path)!r} is not a backbone file of format {CHECKPOINT_FORMAT} (see save_backbone)")
    return backbone_from_checkpoint(checkpoint)


def is_backbone_checkpoint(checkpoint: Any) -> bool:
    """Whether a loaded file is what :func:`save_backbone` writes."""
    return isinstance(checkpoint, dict) and checkpoint.get("format") == CHECKPOINT_FORMAT


def backbone_from_checkpoint(checkpoint: dict[str, Any]) -> VisionTransformer:
    """The ViT of a loaded :func:`save_backbone` file, in eval mode."""
    model = timm.create_model(checkpoint["architecture"], pretrained=False, num_classes=0, **checkpoint["model_kwargs"])
    model.load_state_dict(checkpoint["state_dict"])
    model.pretrained_cfg = {**model.pretrained_cfg, **checkpoint["pretrained_cfg"]}
    return model.eval()
