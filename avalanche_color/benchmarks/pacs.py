"""PACS as a domain-incremental stream, from a local zip file or folder (no download at run time).

One experience per domain (all 7 classes in each), with a seeded train/test split stratified by
class within each domain. The images are decoded once into uint8 tensors at the backbone's
``image_size`` and cached (see :mod:`avalanche_color.benchmarks.archives`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch
from avalanche.benchmarks import tensors_benchmark
from torch import Tensor

from avalanche_color.benchmarks.archives import Archive, cache_folder, cached, data_path, decode_images, resampled
from avalanche_color.benchmarks.stream_building import (DEFAULT_MEAN, DEFAULT_STD, check_domains, check_seed,
                                                        generic_benchmark, stratified_split, subsample_per_class,
                                                        task_labels_of)
from avalanche_color.benchmarks.transforms import Augmentation, offline_transforms

PACS_FILE = "pacs-64px.zip"
PACS_SOURCE = "PACS is published at https://domaingeneralization.github.io/#data (read here in its own layout)"
PACS_DOMAINS = ("art_painting", "cartoon", "photo", "sketch")
PACS_CLASSES = ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person")
PACS_LAYOUT = "PACS/<domain>/<class>/<name>.jpg (possibly under a top folder)"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def pacs(
    path: Optional[str | Path] = None,
    *,
    image_size: int = 32,
    mean: Sequence[float] = DEFAULT_MEAN,
    std: Sequence[float] = DEFAULT_STD,
    seed: int = 0,
    test_fraction: float = 0.2,
    domains: Sequence[str] = PACS_DOMAINS,
    task_labels: bool = False,
    cache_dir: Optional[Path] = None,
    interpolation: str = "bilinear",
    train_per_class: Optional[int] = None,
    augmentation: Augmentation = "light",
):
    """PACS as a domain-incremental stream: experience i is ``domains[i]`` with all 7 classes.

    Args:
        path: a zip file or folder holding ``PACS/<domain>/<class>/<name>.jpg``.
        image_size: the backbone's input side; the images are cached at it or, where they are stored
            smaller, at their own size, and resized to it by the transforms.
        mean, std: the backbone's normalisation.
        seed: the train/test split; a domain's split depends only on the seed, not on ``domains``.
        test_fraction: the share of each class in each domain held out for testing.
        domains: the experiences' domains, in order.
        task_labels: experience i carries task label i (else 0 throughout).
        cache_dir: where the decoded images are cached (None: ``avalanche_color.benchmarks.archives.CACHE_DIR``).
        interpolation: how images are resized, the backbone's (timm's name: bilinear, bicubic, ...).
        augmentation: the training augmentation: ``"light"`` (resize, pad-and-crop, flip; evaluation resizes),
            or ``"paper"``, the paper's (S-Prompts') RandomResizedCrop and flip, with evaluation's Resize
            and CenterCrop (:mod:`avalanche_color.benchmarks.transforms`).
        train_per_class: keep at most this many training images of each class in each domain (a random
            subset drawn with the split's seed, for cheaper CPU runs); None keeps all. The test split is
            the same either way.

    Returns:
        An Avalanche benchmark with ``train_stream`` and ``test_stream``, one experience per domain.
    """
    check_seed(seed)
    domains = check_domains(domains, PACS_DOMAINS)
    if not isinstance(test_fraction, (int, float)) or not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be a number strictly between 0 and 1, got {test_fraction!r}")
    if train_per_class is not None and (isinstance(train_per_class, bool) or not isinstance(train_per_class, int)
                                        or train_per_class < 1):
        raise ValueError(f"train_per_class must be a positive int or None, got {train_per_class!r}")
    train_transform, eval_transform = offline_transforms(augmentation, image_size, mean, std, interpolation)
    path = data_path(path, PACS_FILE, "PACS", PACS_SOURCE)
    data = load_pacs(path, image_size=image_size, cache_dir=cache_dir, interpolation=interpolation)
    train, test = [], []
    for domain in domains:
        index = PACS_DOMAINS.index(domain)
        in_domain = (data["domain_ids"] == index).nonzero().squeeze(1)
        if len(in_domain) == 0:
            raise FileNotFoundError(f"no {domain!r} images in {str(path)!r}: expected the layout {PACS_LAYOUT}")
        rng = np.random.default_rng([seed, index])
        train_part, test_part = stratified_split(data["labels"][in_domain], test_fraction, rng)
        if train_per_class is not None:  # drawn after the split, so the test images stay the same
            train_part = train_part[subsample_per_class(data["labels"][in_domain][train_part], train_per_class, rng)]
        for part, store in ((in_domain[train_part], train), (in_domain[test_part], test)):
            store.append((data["images"][part], data["labels"][part]))
    return generic_benchmark(tensors_benchmark, train, test, task_labels=task_labels_of(len(domains), task_labels),
                             train_transform=train_transform, eval_transform=eval_transform)


def load_pacs(path: Optional[str | Path] = None, *, image_size: int = 32, cache_dir: Optional[Path] = None,
              interpolation: str = "bilinear") -> dict[str, Tensor]:
    """All PACS images, decoded once and cached: ``images`` (N, 3, S, S) uint8 (S: ``image_size``, or the
    stored side where smaller), ``labels`` (index into :data:`PACS_CLASSES`) and ``domain_ids`` (index into
    :data:`PACS_DOMAINS`), in file-name order."""
    archive = Archive(data_path(path, PACS_FILE, "PACS", PACS_SOURCE))
    cache = cache_folder(cache_dir) / f"pacs_{archive.fingerprint()}_{image_size}px{resampled(interpolation)}.pt"
    return cached(cache, lambda: _decode_pacs(archive, image_size, interpolation))


def _decode_pacs(archive: Archive, image_size: int, interpolation: str) -> dict[str, Tensor]:
    found: dict[str, list[tuple[str, int, int]]] = {}  # top folder -> (name, label, domain)
    for name in sorted(archive.names()):
        parts = name.split("/")
        if (len(parts) < 3 or not name.lower().endswith(IMAGE_SUFFIXES)
                or any(part.startswith((".", "__")) for part in parts)):
            continue
        domain, label = parts[-3], parts[-2]
        if domain in PACS_DOMAINS and label in PACS_CLASSES:
            found.setdefault("/".join(parts[:-3]), []).append(
                (name, PACS_CLASSES.index(label), PACS_DOMAINS.index(domain)))
    if not found:
        raise FileNotFoundError(f"no PACS images in {str(archive.path)!r}: expected the layout {PACS_LAYOUT}")
    if len(found) > 1:
        raise ValueError(f"{str(archive.path)!r} holds PACS images under several folders {sorted(found)}; "
                         "give one copy of the data set")
    (entries,) = found.values()
    names, labels, domain_ids = zip(*entries)
    return {"images": decode_images(archive, names, image_size, interpolation), "labels": torch.tensor(labels),
            "domain_ids": torch.tensor(domain_ids)}
