"""Tiny-ImageNet: its official layout read (zip or folder), its pretraining and stream halves, and the
class-incremental stream Split Tiny-ImageNet (no download at run time where the data is given).

The first 100 classes of ``wnids.txt`` (in file order) pretrain the offline backbone;
the other 100 form the class-incremental stream. The two halves never share a class.
Labels are positions in ``wnids.txt``: 0-99 pretraining, 100-199 the stream.

:func:`split_tiny_imagenet`: class-incremental over the 100 classes never used to pretrain the offline
backbone (``wnids.txt`` positions 100-199, relabelled 0-99), 10 per experience in file order; the test
data are those classes' validation images. The images are decoded once into uint8 tensors at the
backbone's ``image_size`` and cached (see :mod:`avalanche_color.benchmarks.archives`); Avalanche applies
the ViT transforms per sample, the training transform to the train stream and the evaluation transform to
the test stream. With ``task_labels=True`` experience i carries task label i (for oracle routing),
otherwise every experience carries task label 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch
from avalanche.benchmarks import nc_benchmark
from torch import Tensor
from torch.utils.data import TensorDataset

from avalanche_color.benchmarks.archives import Archive, cache_folder, cached, data_path, decode_images, resampled
from avalanche_color.benchmarks.stream_building import DEFAULT_MEAN, DEFAULT_STD, check_seed, subsample_per_class
from avalanche_color.benchmarks.transforms import Augmentation, offline_transforms

FILE_NAME = "tiny-imagenet-200-32px.zip"
URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"  # the official release, 64 px
SOURCE = f"Tiny-ImageNet is published at {URL} (64 px; decoded at the backbone's size here)"
PRETRAIN_CLASSES = 100
STREAM_CLASSES = 100


@dataclass(frozen=True)
class TinyImageNet:
    wnids: list[str]
    train_images: Tensor  # (N, 3, S, S) uint8
    train_labels: Tensor  # (N,) int64, index into wnids
    val_images: Tensor
    val_labels: Tensor

    def classes(self, first: int, stop: int) -> "TinyImageNet":
        """Only the classes ``first <= label < stop`` (labels unchanged)."""
        keep_train = (self.train_labels >= first) & (self.train_labels < stop)
        keep_val = (self.val_labels >= first) & (self.val_labels < stop)
        return TinyImageNet(self.wnids, self.train_images[keep_train], self.train_labels[keep_train],
                            self.val_images[keep_val], self.val_labels[keep_val])


def load_tiny_imagenet(path: Optional[str | Path] = None, *, image_size: int = 32, cache_dir: Optional[Path] = None,
                       interpolation: str = "bilinear") -> TinyImageNet:
    """All 200 classes, train and val, decoded once and cached as tensors (at ``image_size``, or the stored
    side where smaller)."""
    archive = Archive(data_path(path, FILE_NAME, "Tiny-ImageNet", SOURCE, URL))
    name = f"tiny_imagenet_{archive.fingerprint()}_{image_size}px{resampled(interpolation)}.pt"
    cache = cache_folder(cache_dir) / name
    return TinyImageNet(**cached(cache, lambda: _decode(archive, image_size, interpolation)))


def _decode(archive: Archive, image_size: int, interpolation: str) -> dict:
    wnids = archive.read(archive.find("wnids.txt")).decode().split()
    index = {wnid: i for i, wnid in enumerate(wnids)}
    names = archive.names()
    # The leading "/" matches "train/..." at the root of an unpacked folder too.
    train = sorted(n for n in names if "/train/" in f"/{n}" and n.endswith(".JPEG"))
    train_labels = [index[f"/{n}".split("/train/")[1].split("/")[0]] for n in train]
    annotations = archive.find("val/val_annotations.txt")
    val_dir = annotations.rsplit("/", 1)[0] + "/images/"
    val, val_labels = [], []
    for line in archive.read(annotations).decode().splitlines():
        if line.strip():
            file, wnid = line.split("\t")[:2]
            val.append(val_dir + file)
            val_labels.append(index[wnid])
    return {
        "wnids": wnids,
        "train_images": decode_images(archive, train, image_size, interpolation),
        "train_labels": torch.tensor(train_labels),
        "val_images": decode_images(archive, val, image_size, interpolation),
        "val_labels": torch.tensor(val_labels),
    }


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
    augmentation: Augmentation = "light",
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
        augmentation: the training augmentation: ``"light"`` (resize, pad-and-crop, flip; evaluation resizes),
            or ``"paper"``, the paper's (S-Prompts') RandomResizedCrop and flip, with evaluation's Resize
            and CenterCrop (:mod:`avalanche_color.benchmarks.transforms`).

    Returns:
        An Avalanche ``NCScenario`` with ``train_stream`` and ``test_stream``.
    """
    check_seed(seed)
    if (isinstance(experiences, bool) or not isinstance(experiences, int) or experiences < 1
            or STREAM_CLASSES % experiences):
        divisors = [d for d in range(1, STREAM_CLASSES + 1) if STREAM_CLASSES % d == 0]
        raise ValueError(f"experiences must divide the {STREAM_CLASSES} stream classes "
                         f"(one of {divisors}), got {experiences!r}")
    if train_per_class is not None and (isinstance(train_per_class, bool) or not isinstance(train_per_class, int)
                                        or train_per_class < 1):
        raise ValueError(f"train_per_class must be a positive int or None, got {train_per_class!r}")
    train_transform, eval_transform = offline_transforms(augmentation, image_size, mean, std, interpolation)
    path = data_path(path, FILE_NAME, "Tiny-ImageNet", SOURCE, URL)
    data = load_tiny_imagenet(path, image_size=image_size, cache_dir=cache_folder(cache_dir),
                              interpolation=interpolation)
    stop = PRETRAIN_CLASSES + STREAM_CLASSES
    if len(data.wnids) != stop:
        raise ValueError(f"{str(path)!r} lists {len(data.wnids)} classes in wnids.txt, expected {stop}")
    stream = data.classes(PRETRAIN_CLASSES, stop)
    train_images, train_labels = stream.train_images, stream.train_labels - PRETRAIN_CLASSES
    test_images, test_labels = stream.val_images, stream.val_labels - PRETRAIN_CLASSES
    for split, labels in (("training", train_labels), ("validation", test_labels)):
        missing = sorted(set(range(STREAM_CLASSES)) - set(labels.tolist()))
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
        fixed_class_order=list(range(STREAM_CLASSES)), class_ids_from_zero_in_each_exp=False,
        train_transform=train_transform, eval_transform=eval_transform,
    )
