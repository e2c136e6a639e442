"""The stream both sides learn: class-incremental, each class a template plus noise."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from avalanche.benchmarks import tensors_benchmark
from torch import Tensor


def make_stream(sizes: SimpleNamespace) -> tuple[Any, list[tuple[Tensor, Tensor]]]:
    """Class-incremental, ``classes`` new classes per experience, each class a template plus noise."""
    generator = torch.Generator().manual_seed(sizes.seed + 4)
    count = sizes.classes * sizes.experiences
    templates = torch.randn(count, 3, sizes.image, sizes.image, generator=generator, dtype=torch.float64)
    train, test = [], []
    for e in range(sizes.experiences):
        labels = torch.arange(e * sizes.classes, (e + 1) * sizes.classes).repeat_interleave(sizes.per_class)
        for store in (train, test):
            noise = torch.randn(len(labels), 3, sizes.image, sizes.image, generator=generator, dtype=torch.float64)
            store.append((templates[labels] + 0.7 * noise, labels))
    return tensors_benchmark(train, test, task_labels=[0] * sizes.experiences), test
