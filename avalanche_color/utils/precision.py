"""Numerics in full precision whatever ``torch.autocast`` the caller runs under.

The routers, k-means and the closed-form classifiers (:mod:`avalanche_color.routing`) pick an expert by a
distance or a score, and under ``torch.autocast(bfloat16)`` a matmul or ``cdist`` computes with 8 bits of
mantissa, enough to send a few percent of samples to another expert: they run under :func:`full_precision`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Callable, ParamSpec, TypeVar

import torch

Parameters = ParamSpec("Parameters")
Result = TypeVar("Result")


def _autocast_devices() -> list[str]:
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices.append("cuda")
    return devices


@contextmanager
def full_precision() -> Iterator[None]:
    """Autocast switched off inside (CPU and, where there is one, CUDA), and left as it was afterwards;
    tensors keep their own dtypes."""
    with ExitStack() as stack:
        for device in _autocast_devices():
            if torch.is_autocast_enabled(device):
                stack.enter_context(torch.autocast(device, enabled=False))
        yield


def in_full_precision(function: Callable[Parameters, Result]) -> Callable[Parameters, Result]:
    """``function`` run under :func:`full_precision`."""

    @functools.wraps(function)
    def run(*args: Parameters.args, **kwargs: Parameters.kwargs) -> Result:
        with full_precision():
            return function(*args, **kwargs)

    return run
