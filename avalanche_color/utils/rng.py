"""The state of the Python, NumPy and torch random generators: saved, restored, or kept untouched."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch


def capture_rng() -> dict[str, Any]:
    """Python, NumPy and torch (CPU, CUDA) generator states, as tensors and plain values."""
    version, python_state, gauss = random.getstate()
    kind, keys, position, has_gauss, cached_gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(python_state), gauss],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached_gauss],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Put the generators back to what :func:`capture_rng` saw."""
    version, python_state, gauss = state["python"]
    random.setstate((version, tuple(python_state), gauss))
    kind, keys, position, has_gauss, cached_gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached_gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextmanager
def generators_untouched() -> Iterator[None]:
    """Run a block without changing the Python, NumPy and torch random generators."""
    state = capture_rng()
    try:
        yield
    finally:
        restore_rng(state)


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run a block with every generator seeded with ``seed``; afterwards they are as before it."""
    with generators_untouched():
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        yield
