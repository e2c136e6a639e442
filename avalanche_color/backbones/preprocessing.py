"""What a backbone expects as input, kept as data with the model: timm's ``pretrained_cfg``.

A timm model carries the preprocessing its weights were pretrained with in ``model.pretrained_cfg``
(input size, interpolation, mean, std, crop). :func:`backbone_data_config` resolves it with
``timm.data.resolve_data_config`` and :func:`backbone_transform` builds the matching transform with
``timm.data.create_transform``, the same way for the package's offline backbones and any timm ViT::

    vit = offline_backbone("digits")
    transform = backbone_transform(vit)           # evaluation: resize, centre crop, normalise
    x = transform(images)                         # (N, 1 or 3, H, W) in [0, 1], uint8, or a PIL image
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from timm.data import create_transform, resolve_data_config
from torch import Tensor, nn
from torchvision import transforms

# The keys of timm's pretrained_cfg that say how inputs are prepared.
PREPROCESSING_KEYS = ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")
INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "box", "hamming", "lanczos")  # timm's names
CROP_MODES = ("center", "squash", "border")


def check_preprocessing(cfg: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The preprocessing keys of a ``pretrained_cfg``, checked, with sequences as tuples (as timm keeps them).

    Other keys are left out; a missing key is left to timm's default. ``where`` names the source
    (a file) in the errors.
    """
    if not isinstance(cfg, Mapping):
        raise ValueError(f"{where}: pretrained_cfg must be a mapping of {PREPROCESSING_KEYS}, got {cfg!r}")
    checked: dict[str, Any] = {}
    if "input_size" in cfg:
        size = cfg["input_size"]
        if not _ints(size, 3):
            raise ValueError(f"{where}: input_size must be 3 positive ints (channels, height, width), got {size!r}")
        checked["input_size"] = tuple(size)
    channels = checked.get("input_size", (None,))[0]
    for key in ("mean", "std"):
        if key in cfg:
            values = cfg[key]
            if not _numbers(values) or (channels is not None and len(values) != channels):
                raise ValueError(f"{where}: {key} must be one number per input channel ({channels or 'any'}), "
                                 f"got {values!r}")
            checked[key] = tuple(float(v) for v in values)
            if key == "std" and min(checked[key]) <= 0:
                raise ValueError(f"{where}: std must be positive for every channel, got {values!r}")
    if "interpolation" in cfg and cfg["interpolation"] not in INTERPOLATIONS:
        raise ValueError(f"{where}: interpolation must be one of {INTERPOLATIONS}, got {cfg['interpolation']!r}")
    if "crop_mode" in cfg and cfg["crop_mode"] not in CROP_MODES:
        raise ValueError(f"{where}: crop_mode must be one of {CROP_MODES}, got {cfg['crop_mode']!r}")
    if "crop_pct" in cfg:
        crop = cfg["crop_pct"]
        if isinstance(crop, bool) or not isinstance(crop, numbers.Real) or not 0 < float(crop) <= 1:
            raise ValueError(f"{where}: crop_pct must be a number in (0, 1], got {crop!r}")
        checked["crop_pct"] = float(crop)
    checked.update({key: cfg[key] for key in ("interpolation", "crop_mode") if key in cfg})
    return checked


def backbone_data_config(model: nn.Module) -> dict[str, Any]:
    """How inputs to ``model`` are prepared: timm's resolved data config of its ``pretrained_cfg``.

    Returns ``input_size`` (channels, height, width), ``interpolation``, ``mean``, ``std``,
    ``crop_pct`` and ``crop_mode``, as ``timm.data.resolve_data_config(model=model)`` gives them,
    except that a ViT built for another image size (``img_size=``) gets its own input size, not
    its architecture's.
    """
    config = resolve_data_config(model=model)
    own = _vit_input_size(model)
    if own is not None:
        config["input_size"] = own
    return config


def backbone_transform(model: nn.Module, *, train: bool = False, **options: Any) -> transforms.Compose:
    """The transform that prepares images for ``model`` as it was pretrained: timm's ``create_transform``.

    Args:
        model: a timm model (the package's :func:`~avalanche_color.backbones.offline_backbone`, a
            :func:`read_backbone` file, or ``timm.create_model(...)``), whose ``pretrained_cfg`` holds
            its preprocessing (:func:`backbone_data_config`).
        train: ``False`` (the default): resize, centre crop and normalise, deterministic.
            ``True``: timm's training augmentation at the model's input size (random resized crop,
            horizontal flip, colour jitter); pass ``hflip=0.0`` etc. to change it.
        options: further keyword arguments of ``timm.data.create_transform``; they take
            precedence over the model's data config.

    The transform takes a PIL image, or a (C, H, W) or (N, C, H, W) tensor: float in [0, 1], or
    uint8 in [0, 255]. A one-channel (grey) image is repeated to the model's channels first.
    It returns float32 tensors of the model's input size, normalised by its mean and std.
    """
    config = {**backbone_data_config(model), **options}
    steps = create_transform(**config, is_training=train)
    return transforms.Compose([FloatImage(config["input_size"][0]), *steps.transforms])


class FloatImage:
    """A PIL image or image tensor with ``channels`` channels: uint8 tensors scaled to [0, 1], grey repeated.

    PIL images stay PIL images (in mode RGB for 3 channels, so that timm's PIL path resizes them);
    float tensors are taken to be in [0, 1] already.
    """

    def __init__(self, channels: int) -> None:
        self.channels = channels

    def __call__(self, image: Any) -> Any:
        if isinstance(image, Tensor):
            if image.dtype == torch.uint8:
                image = image.float() / 255
            if image.ndim < 3:
                raise ValueError(f"an image tensor must be (C, H, W) or (N, C, H, W), got shape {tuple(image.shape)}")
            if image.shape[-3] == 1 and self.channels != 1:
                image = image.expand(*image.shape[:-3], self.channels, *image.shape[-2:])
            if image.shape[-3] != self.channels:
                raise ValueError(f"the backbone takes {self.channels}-channel images (or 1-channel, repeated), "
                                 f"got {image.shape[-3]} channels (shape {tuple(image.shape)})")
            return image
        if hasattr(image, "convert") and hasattr(image, "mode"):  # a PIL image
            mode = {1: "L", 3: "RGB"}.get(self.channels)
            return image.convert(mode) if mode is not None and image.mode != mode else image
        return image

    def __repr__(self) -> str:
        return f"{type(self).__name__}(channels={self.channels})"


def _vit_input_size(model: nn.Module) -> tuple[int, int, int] | None:
    """(channels, height, width) a fixed-size timm ViT was built for; None for other models."""
    patch_embed = getattr(model, "patch_embed", None)
    size = getattr(patch_embed, "img_size", None)
    channels = getattr(getattr(patch_embed, "proj", None), "in_channels", None)
    if size is None or channels is None or getattr(patch_embed, "dynamic_img_size", False):
        return None
    return (int(channels), *size)


def _ints(values: Any, length: int) -> bool:
    return (isinstance(values, Sequence) and not isinstance(values, str) and len(values) == length
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values))


def _numbers(values: Any) -> bool:
    return (isinstance(values, Sequence) and not isinstance(values, str) and len(values) > 0
            and all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values))
