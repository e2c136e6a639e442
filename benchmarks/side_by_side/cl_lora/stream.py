"""The stream both sides learn (``--stream domain`` or ``class``), and their labels, predictions and scores as ours."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from avalanche.benchmarks import tensors_benchmark
from torch import Tensor


def make_stream(sizes: SimpleNamespace) -> tuple[Any, list[tuple[Tensor, Tensor]]]:
    """Train and test tensors per experience; ``domain``: the same classes shifted per experience."""
    g = torch.Generator().manual_seed(sizes.seed)
    templates = 2 * torch.randn(sizes.classes * (1 if sizes.stream == "domain" else sizes.experiences), 3,
                                sizes.image, sizes.image, generator=g)
    train, test = [], []
    for e in range(sizes.experiences):
        offset = 1.5 * torch.randn(3, 1, 1, generator=g) if sizes.stream == "domain" else 0
        first = 0 if sizes.stream == "domain" else e * sizes.classes
        labels = torch.arange(first, first + sizes.classes).repeat_interleave(sizes.per_class)
        for store in (train, test):
            images = templates[labels] + 0.5 * torch.randn(len(labels), 3, sizes.image, sizes.image, generator=g)
            store.append((images + offset, labels))
    return tensors_benchmark(train, test, task_labels=[0] * sizes.experiences), test


def their_labels(y: Tensor, e: int, sizes: SimpleNamespace) -> Tensor:
    return y + e * sizes.classes if sizes.stream == "domain" else y


def their_predictions(logits: Tensor, sizes: SimpleNamespace) -> Tensor:
    """Their prediction as a class of ours: the class of the best (experience, class) column."""
    predicted = logits.argmax(1)
    return predicted % sizes.classes if sizes.stream == "domain" else predicted


def their_class_scores(logits: Tensor, sizes: SimpleNamespace) -> Tensor:
    """Their logits as ours: on a domain stream a class's best score over its experiences."""
    if sizes.stream != "domain":
        return logits
    return logits.reshape(logits.shape[0], -1, sizes.classes).amax(1)
