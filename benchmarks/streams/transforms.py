"""The paper's ViT input pipeline: a light random crop and flip for training, a centre crop for evaluation.

The backbone is frozen and only low-rank adapters are trained, so the augmentation is
mild: the image is resized to the backbone's
``image_size`` (its shorter side), padded by an eighth of that and randomly cropped back,
and flipped. Evaluation resizes and centre-crops, so it is deterministic. Both end with the
backbone's own ``mean`` and ``std``. Inputs may be uint8 (3, H, W) tensors (the offline
streams keep their images decoded like that) or PIL images (torchvision's data sets).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torchvision.transforms import v2


def vit_transforms(image_size: int, mean: Sequence[float], std: Sequence[float]) -> tuple[v2.Compose, v2.Compose]:
    """The (train, eval) transforms for a ViT taking ``image_size`` px inputs normalised by ``mean``, ``std``.

    Both return plain float32 (3, image_size, image_size) tensors.
    """
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1:
        raise ValueError(f"image_size must be a positive int, got {image_size!r}")
    mean, std = _channel_values("mean", mean), _channel_values("std", std)
    if min(std) <= 0:
        raise ValueError(f"std must be positive for every channel, got {std}")
    normalise = [v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std), v2.ToPureTensor()]
    # Resize is a no-op for images already at image_size (the cached offline streams).
    resize = [v2.ToImage(), v2.Resize(image_size, antialias=True)]
    train = v2.Compose([*resize, v2.RandomCrop(image_size, padding=image_size // 8),
                        v2.RandomHorizontalFlip(), *normalise])
    evaluate = v2.Compose([*resize, v2.CenterCrop(image_size), *normalise])
    return train, evaluate


def _channel_values(name: str, values: Sequence[float]) -> list[float]:
    try:
        numbers = [float(v) for v in values]
    except (TypeError, ValueError):
        numbers = []
    if len(numbers) != 3:
        raise ValueError(f"{name} must be 3 numbers (one per RGB channel), got {values!r}")
    return numbers
