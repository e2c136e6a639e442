"""Python values read from small device tensors once per change, not in every forward.

Reading a tensor on the host (``bool(t.any())``, ``t.tolist()``, ``int(t.max())``) waits for the
GPU to finish everything queued before it: a host sync. Flags such as which components are
finished or which classes are trained change once per experience, but a forward needs them every
step; :func:`host_value` reads such a tensor once and answers from the kept value until the tensor
is replaced (another object) or changed in place (its version counter moves: ``t[i] = ...``,
``copy_`` from ``load_state_dict``).
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from torch import Tensor

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
