"""Two small pretrained ViTs that ship with the package, and the file format they are stored in.

For trying things offline, where no pretrained weights can be downloaded (use a real
pretrained timm ViT for real work)::

    from avalanche_color.backbones import offline_backbone
    vit = offline_backbone("digits")     # 16 px, 4 blocks x 64, pretrained on held-out scikit-learn digits
    vit = offline_backbone("offline")    # 32 px, 4 blocks x 96, pretrained on Tiny-ImageNet classes 0-99

Both are timm ``VisionTransformer`` s without a classifier head. Each carries the preprocessing
it was pretrained with (input size, interpolation, mean, std, crop) in ``pretrained_cfg``, as
timm's models do, and :func:`backbone_transform` gives the matching transform::

    transform = backbone_transform(vit)  # e.g. digits: 8 px grey in [0, 1] -> bilinear 16 px, 3 channels, (x - 0.5) / 0.5

How each was made: the repository's ``benchmarks/pretraining/README.md`` (``python -m
benchmarks.pretraining.tiny_imagenet`` and ``benchmarks.pretraining.digits`` make them again). A file holds the timm
architecture name, the keyword arguments it was resized with, the preprocessing and the weights
(:func:`save_backbone`); a JSON file of the same name beside it may give the preprocessing
(its ``"pretrained_cfg"``), as the shipped backbones' do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import timm
import torch
from timm.models.vision_transformer import VisionTransformer

from avalanche_color.backbones.preprocessing import (PREPROCESSING_KEYS, backbone_data_config, backbone_transform,
                                                     check_preprocessing)
from avalanche_color.utils.files import torch_save_atomically

OfflineBackbone = Literal["offline", "digits"]
FILES: dict[str, Path] = {"offline": Path(__file__).parent / "vit_tinyimagenet100_32px.pt",
                          "digits": Path(__file__).parent / "vit_digits_16px.pt"}
CHECKPOINT_FORMAT = 1
__all__ = ["backbone_data_config", "backbone_transform", "offline_backbone", "read_backbone", "save_backbone"]


def offline_backbone(name: OfflineBackbone = "offline") -> VisionTransformer:
    """One of the package's small pretrained ViTs, in eval mode, without a head."""
    if name not in FILES:
        raise ValueError(f"name must be one of {tuple(FILES)}, got {name!r}")
    return read_backbone(FILES[name])


def save_backbone(model: VisionTransformer, path: Path, *, architecture: str, model_kwargs: dict[str, Any],
                  extra: dict[str, Any] | None = None) -> None:
    """Writes a headless timm ViT with what is needed to rebuild it (atomically).

    The preprocessing recorded is the model's ``pretrained_cfg`` (input size, interpolation, mean,
    std, crop), its input size the model's own: set ``model.pretrained_cfg`` to how it was trained.
    """
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("head.")}
    checkpoint = {
        "format": CHECKPOINT_FORMAT,
        "architecture": architecture,
        "model_kwargs": model_kwargs,
        "pretrained_cfg": _preprocessing(model),
        "state_dict": state,
        **(extra or {}),
    }
    torch_save_atomically(checkpoint, path)


def read_backbone(path: Path) -> VisionTransformer:
    """The ViT a :func:`save_backbone` file holds, in eval mode, its preprocessing in ``pretrained_cfg``.

    A JSON file beside it with the same name (``vit.pt``: ``vit.json``) may hold the preprocessing
    as ``"pretrained_cfg"`` (keys of timm's: input_size, interpolation, mean, std, crop_pct,
    crop_mode); where it does, it takes precedence over the file's own.
    """
    path = Path(path)
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if not is_backbone_checkpoint(checkpoint):
        raise ValueError(f"{str(path)!r} is not a backbone file of format {CHECKPOINT_FORMAT} (see save_backbone)")
    return backbone_from_checkpoint(checkpoint, preprocessing=preprocessing_beside(path))


def preprocessing_beside(path: Path) -> dict[str, Any]:
    """The ``"pretrained_cfg"`` of the JSON file beside a backbone file, checked; empty if there is none."""
    sidecar = Path(path).with_suffix(".json")
    if not sidecar.is_file():
        return {}
    try:
        record = json.loads(sidecar.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{str(sidecar)!r} cannot be read as JSON: {error}") from None
    if not isinstance(record, dict) or "pretrained_cfg" not in record:
        return {}
    return check_preprocessing(record["pretrained_cfg"], str(sidecar))


def is_backbone_checkpoint(checkpoint: Any) -> bool:
    """Whether a loaded file is what :func:`save_backbone` writes."""
    return isinstance(checkpoint, dict) and checkpoint.get("format") == CHECKPOINT_FORMAT


def backbone_from_checkpoint(checkpoint: dict[str, Any], preprocessing: dict[str, Any] | None = None
                             ) -> VisionTransformer:
    """The ViT of a loaded :func:`save_backbone` file, in eval mode.

    Its ``pretrained_cfg`` is the architecture's, updated with the file's preprocessing and then
    with ``preprocessing`` (e.g. :func:`preprocessing_beside`'s).
    """
    model = timm.create_model(checkpoint["architecture"], pretrained=False, num_classes=0, **checkpoint["model_kwargs"])
    model.load_state_dict(checkpoint["state_dict"])
    saved = check_preprocessing(checkpoint["pretrained_cfg"], f"{checkpoint['architecture']} backbone file")
    model.pretrained_cfg = {**_pretrained_cfg(model), **saved, **(preprocessing or {})}
    return model.eval()


def _preprocessing(model: VisionTransformer) -> dict[str, Any]:
    """The model's preprocessing as :func:`save_backbone` records it: its pretrained_cfg's, its own input size."""
    cfg = {key: value for key, value in _pretrained_cfg(model).items() if key in PREPROCESSING_KEYS}
    # The registered architecture's cfg names its own input size; the model may be resized.
    return check_preprocessing({**cfg, "input_size": backbone_data_config(model)["input_size"]}, "the model")


def _pretrained_cfg(model: VisionTransformer) -> dict[str, Any]:
    cfg: dict[str, Any] = dict(getattr(model, "pretrained_cfg", None) or {})
    return cfg
