"""Streams that need no download at run time: PACS by domain, Tiny-ImageNet by class, from local files.

The images are decoded once into uint8 tensors at the backbone's ``image_size`` and cached
(see :mod:`avalanche_color.benchmarks.archives`); Avalanche applies the ViT transforms per sample, the
training transform to the train stream and the evaluation transform to the test stream.

* :func:`pacs`: domain-incremental, one experience per domain (all 7 classes in each), with a
  seeded train/test split stratified by class within each domain.
* :func:`split_tiny_imagenet`: class-incremental over the 100 Tiny-ImageNet classes never used
  to pretrain the offline backbone (``wnids.txt`` positions 100-199, relabelled 0-99), 10 per
  experience in file order; the test data are those classes' validation images.

With ``task_labels=True`` experience i carries task label i (for oracle routing), otherwise
every experience carries task label 0.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from avalanche.benchmarks import GenericCLScenario, nc_benchmark, tensors_benchmark
from torch import Tensor
from torch.utils.data import TensorDataset

from avalanche_color.benchmarks import archives
from avalanche_color.benchmarks.archives import Archive, cached, data_path, decode_images
from avalanche_color.benchmarks.tiny_imagenet import FILE_NAME as TINY_IMAGENET_FILE
from avalanche_color.benchmarks.tiny_imagenet import PRETRAIN_CLASSES, load_tiny_imagenet
from avalanche_color.benchmarks.tiny_imagenet import SOURCE as TINY_IMAGENET_SOURCE
from avalanche_color.benchmarks.tiny_imagenet import URL as TINY_IMAGENET_URL

PACS_FILE = "pacs-64px.zip"
PACS_SOURCE = "PACS is published at https://domaingeneralization.github.io/#data (read here in its own layout)"
from avalanche_color.benchmarks.transforms import vit_transforms

PACS_DOMAINS = ("art_painting", "cartoon", "photo", "sketch")
PACS_CLASSES = ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person")
PACS_LAYOUT = "PACS/<domain>/<class>/<name>.jpg (possibly under a top folder)"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
TINY_IMAGENET_STREAM_CLASSES = 100
DEFAULT_MEAN = (0.5, 0.5, 0.5)
DEFAULT_STD = (0.5, 0.5, 0.5)


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
):
    """PACS as a domain-incremental stream: experience i is ``domains[i]`` with all 7 classes.

    Args:
        path: a zip file or folder holding ``PACS/<domain>/<class>/<name>.jpg``.
        image_size: the side the images are decoded (and cached) at, the backbone's input size.
        mean, std: the backbone's normalisation.
        seed: the train/test split; a domain's split depends only on the seed, not on ``domains``.
        test_fraction: the share of each class in each domain held out for testing.
        domains: the experiences' domains, in order.
        task_labels: experience i carries task label i (else 0 throughout).
        cache_dir: where the decoded images are cached (None: ``avalanche_color.benchmarks.archives.CACHE_DIR``).

    Returns:
        An Avalanche benchmark with ``train_stream`` and ``test_stream``, one experience per domain.
    """
    check_seed(seed)
    domains = check_domains(domains, PACS_DOMAINS)
    if not isinstance(test_fraction, (int, float)) or not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be a number strictly between 0 and 1, got {test_fraction!r}")
    train_transform, eval_transform = vit_transforms(image_size, mean, std)
    path = data_path(path, PACS_FILE, "PACS", PACS_SOURCE)
    data = load_pacs(path, image_size=image_size, cache_dir=cache_dir)
    train, test = [], []
    for domain in domains:
        index = PACS_DOMAINS.index(domain)
        in_domain = (data["domain_ids"] == index).nonzero().squeeze(1)
        if len(in_domain) == 0:
            raise FileNotFoundError(f"no {domain!r} images in {str(path)!r}: expected the layout {PACS_LAYOUT}")
        rng = np.random.default_rng([seed, index])
        train_part, test_part = stratified_split(data["labels"][in_domain], test_fraction, rng)
        for part, store in ((in_domain[train_part], train), (in_domain[test_part], test)):
            store.append((data["images"][part], data["labels"][part]))
    return generic_benchmark(tensors_benchmark, train, test, task_labels=task_labels_of(len(domains), task_labels),
                             train_transform=train_transform, eval_transform=eval_transform)


def load_pacs(path: Optional[str | Path] = None, *, image_size: int = 32,
              cache_dir: Optional[Path] = None) -> dict[str, Tensor]:
    """All PACS images, decoded once and cached: ``images`` (N, 3, S, S) uint8, ``labels`` (index
    into :data:`PACS_CLASSES`) and ``domain_ids`` (index into :data:`PACS_DOMAINS`), in file-name order."""
    archive = Archive(data_path(path, PACS_FILE, "PACS", PACS_SOURCE))
    cache = _cache_dir(cache_dir) / f"pacs_{archive.fingerprint()}_{image_size}px.pt"
    return cached(cache, lambda: _decode_pacs(archive, image_size))


def _decode_pacs(archive: Archive, image_size: int) -> dict[str, Tensor]:
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
    return {"images": decode_images(archive, names, image_size), "labels": torch.tensor(labels),
            "domain_ids": torch.tensor(domain_ids)}


def stratified_split(labels: Tensor, test_fraction: float, rng: np.random.Generator) -> tuple[Tensor, Tensor]:
    """Positions (train, test) into ``labels``: a random ``test_fraction`` of each class is test,
    at least one sample of every class with two or more goes to each side."""
    train, test = [], []
    labels = labels.numpy()
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        held_out = min(max(round(test_fraction * len(members)), 1), len(members) - 1)
        test.append(members[:held_out])
        train.append(members[held_out:])
    return torch.from_numpy(np.sort(np.concatenate(train))), torch.from_numpy(np.sort(np.concatenate(test)))


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
):
    """The 100 stream classes of Tiny-ImageNet, class-incremental, in ``wnids.txt`` order.

    Class c of the stream is ``wnids.txt`` line ``100 + c``; experience i holds classes
    ``i * n .. (i + 1) * n - 1`` with ``n = 100 // experiences``. The classes used to pretrain
    the offline backbone (lines 0-99) never appear.

    Args:
        path: the Tiny-ImageNet zip file or folder (official ``tiny-imagenet-200/`` layout).
        experiences: how many experiences; must divide 100.
        image_size: the side the images are decoded (and cached) at, the backbone's input size.
        mean, std: the backbone's normalisation.
        seed: which training images ``train_per_class`` keeps (the class order is fixed).
        train_per_class: keep at most this many training images per class (a seeded random
            subset, to make CPU runs cheaper); None keeps all 500.
        task_labels: experience i carries task label i (else 0 throughout).
        cache_dir: where the decoded images are cached (None: ``avalanche_color.benchmarks.archives.CACHE_DIR``).

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
    train_transform, eval_transform = vit_transforms(image_size, mean, std)
    path = data_path(path, TINY_IMAGENET_FILE, "Tiny-ImageNet", TINY_IMAGENET_SOURCE, TINY_IMAGENET_URL)
    data = load_tiny_imagenet(path, image_size=image_size, cache_dir=_cache_dir(cache_dir))
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


def subsample_per_class(labels: Tensor, per_class: int, rng: np.random.Generator) -> Tensor:
    """Sorted positions into ``labels`` keeping a random ``per_class`` of each class (all if fewer)."""
    labels = labels.numpy()
    keep = [rng.permutation(np.flatnonzero(labels == label))[:per_class] for label in np.unique(labels)]
    return torch.from_numpy(np.sort(np.concatenate(keep)))


def check_seed(seed: int) -> None:
    """Seeds go to numpy's ``default_rng``, which takes non-negative ints."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")


def check_domains(domains: Sequence[str], allowed: Sequence[str]) -> tuple[str, ...]:
    """``domains`` as a tuple, if it is a non-empty sequence of distinct names from ``allowed``."""
    if isinstance(domains, str):
        raise ValueError(f"domains must be a sequence of names from {tuple(allowed)}, got the string {domains!r}")
    domains = tuple(domains)
    if not domains or any(d not in allowed for d in domains) or len(set(domains)) != len(domains):
        raise ValueError(f"domains must be distinct names from {tuple(allowed)}, got {domains!r}")
    return domains


def _cache_dir(cache_dir: Optional[Path]) -> Path:
    return archives.CACHE_DIR if cache_dir is None else Path(cache_dir)  # read late, so tests can move it


def generic_benchmark(generator: Callable[..., GenericCLScenario], *args, eval_transform, **kwargs):
    """``generator(*args, ...)`` (``tensors_benchmark``, ``paths_benchmark``) with a test stream that evaluates.

    Avalanche's ``create_multi_dataset_generic_benchmark``, behind those generators, starts each
    stream's datasets in the transform group of the stream's name, else in "train": the test
    stream would augment until a strategy calls ``.eval()``. A group named "test" (the eval
    transform) fixes that; Avalanche warns about such a group, which is meant here.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message='A transformation group named "test"')
        return generator(*args, eval_transform=eval_transform,
                         other_streams_transforms={"test": (eval_transform, None)}, **kwargs)


def task_labels_of(count: int, distinct: bool) -> list[int]:
    """Experience i's task label: i if ``distinct``, else 0."""
    return list(range(count)) if distinct else [0] * count
