"""Full precision where it matters, whatever ``torch.autocast`` a caller runs under.

Under ``torch.autocast(bfloat16)`` a matmul or ``cdist`` computes in bfloat16 (8 bits of
mantissa): a nearest-prototype distance, a ridge readout or a Gaussian score then picks another
expert for a few percent of samples. The routers, k-means and the closed-form solvers therefore
compute under :func:`full_precision`, which switches autocast off locally (on every device type
that has it) and leaves it as it was afterwards.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Callable, TypeVar

import torch

Function = TypeVar("Function", bound=Callable)


def _autocast_devices() -> list[str]:
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices.append("cuda")
    return devices


@contextmanager
def full_precision() -> Iterator[None]:
    """Autocast switched off inside (CPU and, where there is one, CUDA); tensors keep their own dtypes."""
    with ExitStack() as stack:
        for device in _autocast_devices():
            if torch.is_autocast_enabled(device):
                stack.enter_context(torch.autocast(device, enabled=False))
        yield


def in_full_precision(function: Function) -> Function:
    """``function`` run under :func:`full_precision`."""

    @functools.wraps(function)
    def run(*args, **kwargs):  # type: ignore[no-untyped-def]
        with full_precision():
            return function(*args, **kwargs)

    return run  # type: ignore[return-value]
