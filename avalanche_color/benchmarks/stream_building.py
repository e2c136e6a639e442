"""What the streams share: the default normalisation, the seed and domain checks, seeded per-class splits, task
labels and a generic benchmark whose test stream evaluates; and a validation stream carved from any benchmark's
training experiences, for choosing hyperparameters.

:func:`validation_benchmark` holds out a seeded, class-stratified fraction of every training
experience: the rest is the new training stream, the held-out part of experience i its test
experience i. The real test stream is never seen, so a choice made on it is not a choice made
on the numbers it is reported with.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Sequence

import numpy as np
import torch
from avalanche.benchmarks import GenericCLScenario, benchmark_from_datasets, with_task_labels
from avalanche.benchmarks.scenarios.supervised import with_classes_timeline
from torch import Tensor

from avalanche_color.utils.checks import open_fraction, require

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


def held_out_indices(labels: np.ndarray, held_out: float, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of ``held_out`` of each class's samples (at least one of a class with two or more,
    never all of a class), drawn with ``rng``."""
    chosen = []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        count = min(len(members) - 1, max(1, math.floor(held_out * len(members) + 0.5)))
        if count > 0:
            chosen.append(rng.permutation(members)[:count])
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)


def validation_benchmark(benchmark: Any, held_out: float = 0.1, seed: int = 0) -> Any:
    """``benchmark``'s training experiences, each split into training and validation data.

    Args:
        benchmark: an Avalanche benchmark whose training experiences' datasets have ``targets``.
        held_out: the fraction of each class of each experience held out, in (0, 1).
        seed: the split's seed: the same split for every method compared on it.

    Returns:
        A benchmark with a ``train_stream`` (what is left of each experience) and a ``test_stream``
        (the held-out part of each), both in the original transforms, task labels and order; their
        experiences say their classes (``classes_in_this_experience``) as the original's do.
    """
    require("held_out", held_out, open_fraction)
    rng = np.random.default_rng(seed)
    train, validation = [], []
    for index, experience in enumerate(benchmark.train_stream):
        dataset = experience.dataset
        labels = np.asarray([int(label) for label in dataset.targets])
        out = held_out_indices(labels, held_out, rng)
        if not len(out):
            raise ValueError(f"training experience {index} has no class with two samples to hold one out for "
                             "validation")
        kept = np.setdiff1d(np.arange(len(labels)), out)
        train.append(dataset.subset(kept.tolist()))
        validation.append(dataset.subset(out.tolist()))
    # benchmark_from_datasets gives bare experiences; Avalanche's IncrementalClassifier (FT-masked's
    # head) reads classes_in_this_experience, which the classes timeline adds.
    validation_stream = with_classes_timeline(benchmark_from_datasets(train=train, test=validation))
    if hasattr(benchmark.train_stream[0], "task_labels"):  # kept for the methods that route by them (the oracle)
        validation_stream = with_task_labels(validation_stream)
    return validation_stream
