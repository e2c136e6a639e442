"""What the offline and paper streams share: the default normalisation, the seed and domain checks, seeded
per-class splits, task labels, the cache folder, and a generic benchmark whose test stream evaluates."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from avalanche.benchmarks import GenericCLScenario
from torch import Tensor

from avalanche_color.benchmarks import archives

DEFAULT_MEAN = (0.5, 0.5, 0.5)
DEFAULT_STD = (0.5, 0.5, 0.5)


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
