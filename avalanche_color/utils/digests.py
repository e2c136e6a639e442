"""Digests of tensors' exact contents: what a checkpoint or a results folder was made from."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch
from torch import Tensor


def tensors_digest(named_tensors: Iterable[tuple[str, Tensor]], digest_size: int = 16) -> str:
    """Hex digest of every tensor's name, shape, dtype and bytes, in the order given."""
    digest = hashlib.blake2b(digest_size=digest_size)
    for name, tensor in named_tensors:
        digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype};".encode())
        digest.update(tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
