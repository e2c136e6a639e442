"""Streams that need no download at run time: PACS by domain, Tiny-ImageNet by class, from local files.

The images are decoded once into uint8 tensors at the backbone's ``image_size`` and cached
(see :mod:`avalanche_color.benchmarks.archives`); Avalanche applies the ViT transforms per sample, the
training transform to the train stream and the evaluation transform to the test stream.

* :func:`~avalanche_color.benchmarks.pacs.pacs`: domain-incremental, one experience per domain (all 7
  classes in each), with a seeded train/test split stratified by class within each domain.
* :func:`split_tiny_imagenet`: class-incremental over the 100 Tiny-ImageNet classes never used
  to pretrain the offline backbone (``wnids.txt`` positions 100-199, relabelled 0-99), 10 per
  experience in file order; the test data are those classes' validation images.

With ``task_labels=True`` experience i carries task label i (for oracle routing), otherwise
every experience carries task label 0.

PACS is in :mod:`avalanche_color.benchmarks.pacs`, the parts both share in
:mod:`avalanche_color.benchmarks.stream_building`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np
from avalanche.benchmarks import nc_benchmark
from torch.utils.data import TensorDataset

from avalanche_color.benchmarks.archives import data_path
from avalanche_color.benchmarks.stream_building import (DEFAULT_MEAN, DEFAULT_STD, _cache_dir, check_seed,
                                                        subsample_per_class)
from avalanche_color.benchmarks.tiny_imagenet import FILE_NAME as TINY_IMAGENET_FILE
from avalanche_color.benchmarks.tiny_imagenet import PRETRAIN_CLASSES, load_tiny_imagenet
from avalanche_color.benchmarks.tiny_imagenet import SOURCE as TINY_IMAGENET_SOURCE
from avalanche_color.benchmarks.tiny_imagenet import URL as TINY_IMAGENET_URL
from avalanche_color.benchmarks.transforms import vit_transforms

TINY_IMAGENET_STREAM_CLASSES = 100


def split_tiny_imagenet(
    path: Optional[str | Path] = None,
    *,
    experiences: int = 10,
    image_size: int = 32,
    mean: Sequence[float] = DEFAULT_MEAN,
    std: Sequence[float] = DEFAULT_STD,
    seed: int = 0,
    train_per_class: Optional[int] = None,
    task_labels: bool = False,
    cache_dir: Optional[Path] = None,
    interpolation: str = "bilinear",
):
    """The 100 stream classes of Tiny-ImageNet, class-incremental, in ``wnids.txt`` order.

    Class c of the stream is ``wnids.txt`` line ``100 + c``; experience i holds classes
    ``i * n .. (i + 1) * n - 1`` with ``n = 100 // experiences``. The classes used to pretrain
    the offline backbone (lines 0-99) never appear.

    Args:
        path: the Tiny-ImageNet zip file or folder (official ``tiny-imagenet-200/`` layout).
        experiences: how many experiences; must divide 100.
        image_size: the backbone's input side; the images are cached at it or, where they are stored
            smaller, at their own size, and resized to it by the transforms.
        mean, std: the backbone's normalisation.
        seed: which training images ``train_per_class`` keeps (the class order is fixed).
        train_per_class: keep at most this many training images per class (a seeded random
            subset, to make CPU runs cheaper); None keeps all 500.
        task_labels: experience i carries task label i (else 0 throughout).
        cache_dir: where the decoded images are cached (None: ``avalanche_color.benchmarks.archives.CACHE_DIR``).
        interpolation: how images are resized, the backbone's (timm's name: bilinear, bicubic, ...).

    Returns:
        An Avalanche ``NCScenario`` with ``train_stream`` and ``test_stream``.
    """
    check_seed(seed)
    if (isinstance(experiences, bool) or not isinstance(experiences, int) or experiences < 1
            or TINY_IMAGENET_STREAM_CLASSES % experiences):
        divisors = [d for d in range(1, TINY_IMAGENET_STREAM_CLASSES + 1) if TINY_IMAGENET_STREAM_CLASSES % d == 0]
        raise ValueError(f"experiences must divide the {TINY_IMAGENET_STREAM_CLASSES} stream classes "
                         f"(one of {divisors}), got {experiences!r}")
    if train_per_class is not None and (isinstance(train_per_class, bool) or not isinstance(train_per_class, int)
                                        or train_per_class < 1):
        raise ValueError(f"train_per_class must be a positive int or None, got {train_per_class!r}")
    train_transform, eval_transform = vit_transforms(image_size, mean, std, interpolation)
    path = data_path(path, TINY_IMAGENET_FILE, "Tiny-ImageNet", TINY_IMAGENET_SOURCE, TINY_IMAGENET_URL)
    data = load_tiny_imagenet(path, image_size=image_size, cache_dir=_cache_dir(cache_dir),
                              interpolation=interpolation)
    stop = PRETRAIN_CLASSES + TINY_IMAGENET_STREAM_CLASSES
    if len(data.wnids) != stop:
        raise ValueError(f"{str(path)!r} lists {len(data.wnids)} classes in wnids.txt, expected {stop}")
    stream = data.classes(PRETRAIN_CLASSES, stop)
    train_images, train_labels = stream.train_images, stream.train_labels - PRETRAIN_CLASSES
    test_images, test_labels = stream.val_images, stream.val_labels - PRETRAIN_CLASSES
    for split, labels in (("training", train_labels), ("validation", test_labels)):
        missing = sorted(set(range(TINY_IMAGENET_STREAM_CLASSES)) - set(labels.tolist()))
        if missing:
            names = [data.wnids[PRETRAIN_CLASSES + c] for c in missing]
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            raise ValueError(f"{str(path)!r} has no {split} images of {len(names)} stream classes ({shown}): "
                             "expected the official tiny-imagenet-200/ layout, in a zip or a folder")
    if train_per_class is not None:
        keep = subsample_per_class(train_labels, train_per_class, np.random.default_rng(seed))
        train_images, train_labels = train_images[keep], train_labels[keep]
    return nc_benchmark(
        TensorDataset(train_images, train_labels), TensorDataset(test_images, test_labels),
        n_experiences=experiences, task_labels=task_labels, shuffle=False,
        fixed_class_order=list(range(TINY_IMAGENET_STREAM_CLASSES)), class_ids_from_zero_in_each_exp=False,
        train_transform=train_transform, eval_transform=eval_transform,
    )
