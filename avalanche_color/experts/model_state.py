"""What identifies a routed expert model's learned state, for the checkpoint and the saved folder.

Both formats keep the experts without the backbone, so both record the model's settings,
a fingerprint of the frozen backbone and Avalanche's bookkeeping on the model.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from avalanche_color.utils.digests import tensors_digest


def model_settings(model: nn.Module) -> dict[str, Any]:
    """The settings of a routed expert model that decide what its experts' weights mean."""
    return {"model": type(model).__name__, **model.config.expert_settings()}


def backbone_fingerprint(model: nn.Module) -> str:
    """A digest of the frozen backbone: every non-expert tensor's name, shape, dtype and bytes.

    Experts are only meaningful on the backbone they were trained on; the files
    keep this digest instead of a copy of the backbone.
    """
    experts = set(model.experts_state_dict())
    return tensors_digest((name, tensor) for name, tensor in model.state_dict().items() if name not in experts)


def model_extras(model: nn.Module) -> dict[str, Any]:
    """Avalanche's per-model bookkeeping that is not in the state_dict."""
    extras: dict[str, Any] = {}
    if hasattr(model, "max_class_label"):
        extras["max_class_label"] = int(model.max_class_label)
    if hasattr(model, "known_train_tasks_labels"):
        extras["known_train_tasks_labels"] = sorted(int(t) for t in model.known_train_tasks_labels)
    return extras


def restore_model_extras(model: nn.Module, extras: dict[str, Any]) -> None:
    """Put back what :func:`model_extras` recorded."""
    if "max_class_label" in extras:
        model.max_class_label = extras["max_class_label"]
    if "known_train_tasks_labels" in extras:
        model.known_train_tasks_labels = set(extras["known_train_tasks_labels"])
