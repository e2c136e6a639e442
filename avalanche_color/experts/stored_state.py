"""Reading a stored state into a routed expert model: earlier key names, and expert shapes checked first.

The state of a routed model is the backbone's (never saved), the experts' modules (in their
slots), the expert bank (heads and records, under ``bank.``) and the router (``router.``).
Files written before the expert bank existed name the heads and records at the top level and
the class router ``class_router.``; :func:`renamed_keys` reads them as today's names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

# Earlier key prefixes -> today's (read from saved folders and checkpoints of version 2).
EARLIER_PREFIXES = {"heads.": "bank.heads.", "expert_experiences": "bank.experiences",
                    "expert_tasks": "bank.tasks", "expert_finished": "bank.finished"}


def renamed_keys(state_dict: dict[str, Any], prefix: str, router_keys: Sequence[str]) -> None:
    """Rename, in place, the keys of a state written before the expert bank to today's names.

    ``router_keys``: the names (without prefix) this model's router stores. The earlier models
    kept nearest-prototype state beside a class router (``class_router.``); the router that
    routes takes the ``router.`` names and state for another router is dropped.
    """
    if f"{prefix}bank.experiences" in state_dict or f"{prefix}expert_experiences" not in state_dict:
        return
    for key in [k for k in state_dict if k.startswith(prefix)]:
        name = key[len(prefix):]
        for earlier, today in EARLIER_PREFIXES.items():
            if name.startswith(earlier):
                state_dict[prefix + today + name[len(earlier):]] = state_dict.pop(key)
    has_class_router = any(k.startswith(f"{prefix}class_router.") for k in state_dict)
    for key in [k for k in state_dict if k.startswith(f"{prefix}router.")]:
        if has_class_router or key[len(prefix) + len("router."):] not in router_keys:
            del state_dict[key]
    for key in [k for k in state_dict if k.startswith(f"{prefix}class_router.")]:
        state_dict[prefix + "router." + key[len(prefix) + len("class_router."):]] = state_dict.pop(key)


def stored_expert_classes(state_dict: dict[str, Any], prefix: str) -> list[list[int]]:
    """The classes of each expert a stored state holds (as many as its bank's records say)."""
    experiences = state_dict.get(f"{prefix}bank.experiences")
    count = 0 if experiences is None else len(experiences)
    return [state_dict[f"{prefix}bank.heads.{index}.classes"].tolist() for index in range(count)]


def check_stored_shapes(model: nn.Module, slots: Sequence[nn.ModuleList], new_modules: Sequence[nn.Module],
                        state_dict: dict[str, Any], prefix: str, options: str) -> None:
    """Refuse a stored state whose expert tensors have other shapes than ``model``'s experts,
    naming the tensor and ``options`` (the options that decide the shapes)."""
    names = {id(module): name for name, module in model.named_modules()}
    for slot, module in zip(slots, new_modules, strict=True):
        expected = {name: tuple(tensor.shape) for name, tensor in module.state_dict().items()}
        slot_prefix = f"{prefix}{names[id(slot)]}."
        for key, tensor in state_dict.items():
            if not key.startswith(slot_prefix):
                continue
            name = key[len(slot_prefix):].partition(".")[2]  # the key inside one expert's module
            if name in expected and tuple(tensor.shape) != expected[name]:
                raise ValueError(f"state does not fit this model: {key[len(prefix):]} has shape "
                                 f"{tuple(tensor.shape)}, this model's experts have {expected[name]} "
                                 f"({options}); build the model with the options it was saved with")
