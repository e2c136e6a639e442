"""Reading a stored state into a routed expert model: the expert shapes checked first.

The state of a routed model is the backbone's (never saved), the experts' modules (in their
slots), the expert bank (heads and records, under ``bank.``) and the router (``router.``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

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
