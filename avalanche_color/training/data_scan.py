"""The checks of the data itself: the scan of a training experience, finite pixels, sparse class ids.

What each refuses or warns about, and when the strategies run them: :mod:`avalanche_color.training.data_checks`.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from avalanche_color.experts.backbone import backbone_images
from avalanche_color.training.loaders import data_loader, loader_options
from avalanche_color.utils.checks import positive_int, require
from avalanche_color.utils.experiences import experience_classes
from avalanche_color.utils.rng import generators_untouched


def check_training_experience(experience: Any, vit: Any, batch_size: int = 256, num_workers: int = 0) -> None:
    """Refuse an experience CoLoR cannot learn from, naming the first bad sample.

    Args:
        experience: an Avalanche training experience.
        vit: the timm ViT the images go to (its patch embedding says what it takes).
        batch_size: samples loaded at a time by the scan.
        num_workers: worker processes loading them (0: this process).
    """
    require("batch_size", batch_size, positive_int)
    options = loader_options({"num_workers": num_workers})
    experience_id = experience.current_experience
    dataset = experience.dataset.train()
    if len(dataset) == 0:
        raise ValueError(
            f"experience {experience_id} has no training samples; every training experience needs "
            f"at least one (and at least k for its prototypes)"
        )
    declared = experience_classes(experience)
    if declared and declared[0] < 0:
        raise ValueError(f"experience {experience_id} declares classes {declared}; class ids must be >= 0")
    allowed = torch.tensor(declared, dtype=torch.long)
    checked_shape = None
    index = 0
    with generators_untouched():
        for samples in data_loader(dataset, options, torch.device("cpu"), batch_size=batch_size, collate_fn=list):
            for sample in samples:
                image, label = torch.as_tensor(sample[0]), torch.as_tensor(sample[1])
                where = f"experience {experience_id}, sample {index}"
                if image.shape != checked_shape:
                    try:
                        backbone_images(vit, image.unsqueeze(0))  # refuses what the backbone cannot take
                    except ValueError as error:
                        raise ValueError(f"{where}: {error}") from None
                    checked_shape = image.shape
                if not bool(torch.isfinite(image).all()):
                    raise ValueError(f"{where}: images must have finite pixels, got {_non_finite(image)}")
                if label.numel() != 1 or label.is_floating_point() or label.dtype == torch.bool:
                    raise ValueError(
                        f"{where}: labels must be integer class ids (one per sample), got {label.tolist()!r} "
                        f"of dtype {label.dtype}; convert them, e.g. torch.as_tensor(labels).long()"
                    )
                if int(label) < 0:
                    raise ValueError(f"{where}: labels must be class ids >= 0, got {int(label)}")
                if not bool(torch.isin(label.long(), allowed)):
                    raise ValueError(
                        f"{where}: label must be one of the experience's declared classes {declared}, "
                        f"got {label.tolist()!r}"
                    )
                index += 1


# Class ids far above the number of classes: a warning from this largest id on (see warn_sparse_class_ids).
SPARSE_CLASS_ID = 1000
# ... when the largest id is more than this many times the number of distinct classes seen.
SPARSE_CLASS_RATIO = 10


def warn_sparse_class_ids(experience_id: int, classes: Sequence[int], seen: Iterable[int] = ()) -> None:
    """Warn when class ids run far above the classes seen: the outputs grow with the largest id.

    Every strategy's output covers class ids 0 to the largest seen, and the heads of SD-LoRA and
    L2P hold a row per id, so labels such as 100000 for a handful of classes cost millions of
    parameters for nothing. Such ids are allowed (a subset of a large label space is valid), but
    when the largest id is at least :data:`SPARSE_CLASS_ID` (1000) and more than
    :data:`SPARSE_CLASS_RATIO` (10) times the number of distinct classes seen so far (this
    experience's included), a ``UserWarning`` names the experience and the ids.
    """
    known = set(seen) | set(classes)
    if not classes or not known:
        return
    largest = max(classes)
    if largest >= SPARSE_CLASS_ID and largest + 1 > SPARSE_CLASS_RATIO * len(known):
        warnings.warn(
            f"experience {experience_id} has class ids up to {largest}, but only {len(known)} distinct classes "
            f"have been seen; outputs cover every id from 0 to {largest} (SD-LoRA's and L2P's heads hold a "
            f"row of parameters per id). If the ids are not meant to be that sparse, map them to "
            f"0..{len(known) - 1} before building the benchmark",
            UserWarning, stacklevel=2)


def check_finite_images(images: Tensor, where: str) -> None:
    """Refuse a batch with NaN or infinite pixels."""
    if not bool(torch.isfinite(images).all()):
        rows = (~torch.isfinite(images.reshape(len(images), -1))).any(dim=1).nonzero().flatten()
        raise ValueError(
            f"{where}: images must have finite pixels, got {_non_finite(images)} "
            f"in batch rows {rows.tolist()[:10]}"
        )


def _non_finite(images: Tensor) -> str:
    nan = int(torch.isnan(images).sum())
    inf = int(torch.isinf(images).sum())
    return f"{nan} NaN and {inf} infinite values"
