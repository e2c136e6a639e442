"""A model's tensor state, four small tools: which parameters train (:func:`train_only`), buffers whose shapes a stored ``state_dict`` decides
(:func:`take_stored_shapes`), a digest of tensors' exact contents (:func:`tensors_digest`: what a checkpoint
or a results folder was made from), and Python values read once from small device tensors (:func:`host_value`).

**Host values.** Reading a tensor on the host (``bool(t.any())``, ``t.tolist()``, ``int(t.max())``) waits for the
GPU to finish everything queued before it: a host sync. Flags such as which components are
finished or which classes are trained change once per experience, but a forward needs them every
step; :func:`host_value` reads such a tensor once and answers from the kept value until the tensor
is replaced (another object) or changed in place (its version counter moves: ``t[i] = ...``,
``copy_`` from ``load_state_dict``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any, Callable, TypeVar

import torch
from torch import Tensor, nn


def train_only(module: nn.Module, trainable: Iterable[nn.Parameter]) -> None:
    """``requires_grad`` on ``trainable`` and off on every other parameter of ``module``, whose stale gradients
    are dropped (a finished part would otherwise keep its last ones, and an optimiser with weight decay
    could still move it)."""
    kept = {id(parameter) for parameter in trainable}
    for parameter in module.parameters():
        parameter.requires_grad_(id(parameter) in kept)
        if id(parameter) not in kept:
            parameter.grad = None


def take_stored_shapes(module: nn.Module, state_dict: dict[str, Any], prefix: str, names: Iterable[str]) -> None:
    """Give each named buffer of ``module`` the shape and dtype it has in ``state_dict``, before loading.

    For buffers that grow with the stream (prototypes, routing statistics): loading a later
    state into a fresh module then fills them instead of failing on the shape.
    """
    for name in names:
        stored = state_dict.get(prefix + name)
        if stored is not None:
            setattr(module, name, torch.empty_like(stored, device=getattr(module, name).device))


# ---------------------------------------------------------------------- digests


def tensors_digest(named_tensors: Iterable[tuple[str, Tensor]], digest_size: int = 16) -> str:
    """Hex digest of every tensor's name, shape, dtype and bytes, in the order given."""
    digest = hashlib.blake2b(digest_size=digest_size)
    for name, tensor in named_tensors:
        digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype};".encode())
        digest.update(tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


# ---------------------------------------------------------------------- host values

Value = TypeVar("Value")


def host_value(owner: Any, key: str, tensor: Tensor, read: Callable[[Tensor], Value]) -> Value:
    """``read(tensor)``, kept on ``owner`` under ``key`` while ``tensor`` is the same object, unchanged."""
    kept: dict[str, tuple[Tensor, int, Any]] = owner.__dict__.setdefault("_host_values", {})
    entry = kept.get(key)
    if entry is not None and entry[0] is tensor and entry[1] == tensor._version:
        return entry[2]
    value = read(tensor)
    kept[key] = (tensor, tensor._version, value)
    return value


def keep_host_value(owner: Any, key: str, tensor: Tensor, value: Any) -> None:
    """Record ``value`` as what :func:`host_value` would read from ``tensor`` (known on the host already,
    e.g. from the Python class ids just written into it): no read at all."""
    owner.__dict__.setdefault("_host_values", {})[key] = (tensor, tensor._version, value)
