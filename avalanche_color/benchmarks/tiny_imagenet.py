"""Tiny-ImageNet from its official layout (zip or folder), split into pretraining and stream halves.

The first 100 classes of ``wnids.txt`` (in file order) pretrain the offline backbone;
the other 100 form the class-incremental stream. The two halves never share a class.
Labels are positions in ``wnids.txt``: 0-99 pretraining, 100-199 the stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

from avalanche_color.benchmarks import archives
from avalanche_color.benchmarks.archives import Archive, cached, data_path, decode_images, resampled

FILE_NAME = "tiny-imagenet-200-32px.zip"
URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"  # the official release, 64 px
SOURCE = f"Tiny-ImageNet is published at {URL} (64 px; decoded at the backbone's size here)"
PRETRAIN_CLASSES = 100


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
    cache = (archives.CACHE_DIR if cache_dir is None else Path(cache_dir)) / name
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
