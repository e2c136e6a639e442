"""A validation stream carved from a benchmark's training experiences, for choosing hyperparameters.

:func:`validation_benchmark` holds out a seeded, class-stratified fraction of every training
experience: the rest is the new training stream, the held-out part of experience i its test
experience i. The real test stream is never seen, so a choice made on it is not a choice made
on the numbers it is reported with.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from avalanche.benchmarks import benchmark_from_datasets, with_task_labels

from avalanche_color.utils.checks import open_fraction, require


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
        (the held-out part of each), both in the original transforms, task labels and order.
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
    validation_stream = benchmark_from_datasets(train=train, test=validation)
    if hasattr(benchmark.train_stream[0], "task_labels"):  # kept for the methods that route by them (the oracle)
        validation_stream = with_task_labels(validation_stream)
    return validation_stream
