"""The ViT input pipelines: the paper's (S-Prompts') for the paper's benchmarks, a lighter one for the offline ones.

:func:`paper_transforms`, which the paper adopts from S-Prompts (its code's ``utils/data.py``):
RandomResizedCrop and a horizontal flip for training; Resize to 256/224 of the input size
(256 px for 224) and a centre crop for evaluation. :func:`vit_transforms`, for the small
offline images (32 px and less, where a random resized crop would leave little): the image is
resized to the backbone's ``image_size`` (its shorter side), padded by an eighth of that and
randomly cropped back, and flipped; evaluation resizes and centre-crops. An offline stream takes either
(:func:`offline_transforms`, ``augmentation="light"`` or ``"paper"``). Evaluation is
deterministic in both. Every resize uses ``interpolation``, the backbone's (timm's name: bilinear,
bicubic, ...). Both end with ``mean`` and ``std``. Inputs may be uint8 (3, H, W)
tensors (the offline streams keep their images decoded like that) or PIL images
(torchvision's data sets).
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch
from torchvision.transforms import v2

# The training augmentations an offline stream takes (``augmentation=``): the light default for its small
# images, or the paper's (S-Prompts') random resized crop, which ``--preset paper`` gives every stream.
Augmentation = Literal["light", "paper"]
AUGMENTATIONS: tuple[Augmentation, ...] = ("light", "paper")


def vit_transforms(image_size: int, mean: Sequence[float], std: Sequence[float],
                   interpolation: str = "bilinear") -> tuple[v2.Compose, v2.Compose]:
    """The (train, eval) transforms for a ViT taking ``image_size`` px inputs normalised by ``mean``, ``std``.

    Both return plain float32 (3, image_size, image_size) tensors.
    """
    normalise = _normalise(image_size, mean, std)
    # Resize is a no-op for images already at image_size (the cached offline streams); it enlarges
    # images cached at their stored size for a backbone that takes larger inputs.
    resize = [v2.ToImage(), v2.Resize(image_size, interpolation=_mode(interpolation), antialias=True)]
    train = v2.Compose([*resize, v2.RandomCrop(image_size, padding=image_size // 8),
                        v2.RandomHorizontalFlip(), *normalise])
    evaluate = v2.Compose([*resize, v2.CenterCrop(image_size), *normalise])
    return train, evaluate


def paper_transforms(image_size: int, mean: Sequence[float], std: Sequence[float],
                     interpolation: str = "bilinear") -> tuple[v2.Compose, v2.Compose]:
    """S-Prompts' (train, eval) transforms, which the paper adopts, for ``image_size`` px inputs.

    Training: RandomResizedCrop(image_size) (torchvision's scale 0.08-1 and ratio 3/4-4/3) and
    a horizontal flip; evaluation: Resize(image_size * 256 / 224) of the shorter side and
    CenterCrop(image_size), which for 224 px is S-Prompts' Resize(256) and CenterCrop(224).
    Both return plain float32 (3, image_size, image_size) tensors normalised by ``mean``, ``std``.
    """
    normalise = _normalise(image_size, mean, std)
    mode = _mode(interpolation)
    train = v2.Compose([v2.ToImage(), v2.RandomResizedCrop(image_size, interpolation=mode, antialias=True),
                        v2.RandomHorizontalFlip(), *normalise])
    evaluate = v2.Compose([v2.ToImage(), v2.Resize(round(image_size * 256 / 224), interpolation=mode, antialias=True),
                           v2.CenterCrop(image_size), *normalise])
    return train, evaluate


def offline_transforms(augmentation: str, image_size: int, mean: Sequence[float], std: Sequence[float],
                       interpolation: str = "bilinear") -> tuple[v2.Compose, v2.Compose]:
    """An offline stream's (train, eval) transforms: :func:`vit_transforms` for ``augmentation="light"``,
    :func:`paper_transforms` for ``"paper"``."""
    if augmentation not in AUGMENTATIONS:
        raise ValueError(f"augmentation must be one of {AUGMENTATIONS}, got {augmentation!r}")
    pipeline = vit_transforms if augmentation == "light" else paper_transforms
    return pipeline(image_size, mean, std, interpolation)


def _normalise(image_size: int, mean: Sequence[float], std: Sequence[float]) -> list[v2.Transform]:
    """Checks the arguments; the steps from an image to a normalised float32 tensor."""
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1:
        raise ValueError(f"image_size must be a positive int, got {image_size!r}")
    mean, std = _channel_values("mean", mean), _channel_values("std", std)
    if min(std) <= 0:
        raise ValueError(f"std must be positive for every channel, got {std}")
    return [v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std), v2.ToPureTensor()]


def _mode(interpolation: str) -> v2.InterpolationMode:
    """torchvision's mode for one of timm's interpolation names (as a ``pretrained_cfg`` gives it)."""
    modes = {"nearest": v2.InterpolationMode.NEAREST, "bilinear": v2.InterpolationMode.BILINEAR,
             "bicubic": v2.InterpolationMode.BICUBIC, "box": v2.InterpolationMode.BOX,
             "hamming": v2.InterpolationMode.HAMMING, "lanczos": v2.InterpolationMode.LANCZOS}
    if interpolation not in modes:
        raise ValueError(f"interpolation must be one of {tuple(modes)}, got {interpolation!r}")
    return modes[interpolation]


def _channel_values(name: str, values: Sequence[float]) -> list[float]:
    try:
        numbers = [float(v) for v in values]
    except (TypeError, ValueError):
        numbers = []
    if len(numbers) != 3:
        raise ValueError(f"{name} must be 3 numbers (one per RGB channel), got {values!r}")
    return numbers
