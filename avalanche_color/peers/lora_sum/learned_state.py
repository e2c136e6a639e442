"""What a LoRA-peer model has learned, as a state dict without the frozen backbone, and loading one back
into a model whose structure grows to fit it first (components, head rows, class masks)."""

from __future__ import annotations

import re
from typing import Protocol

from torch import Tensor, nn

from avalanche_color.utils.state import take_stored_shapes

# The first block's A of each component: the components' ranks, in order.
_COMPONENT_A = re.compile(r"^backbone\.blocks\.0\.attn\.qkv\.components\.(\d+)\.A$")


class LoRASumViT(Protocol):
    """What these functions use of the model (a ``LoRASumViT``, whose methods call them), named here by what
    it has so that this module never imports the model."""

    backbone: nn.Module
    num_experts: int
    max_class_label: int
    trained_classes: Tensor

    def state_dict(self) -> dict[str, Tensor]: ...
    def load_state_dict(self, state: dict[str, Tensor], strict: bool = ...) -> tuple[list[str], list[str]]: ...
    def experts_state_dict(self) -> dict[str, Tensor]: ...
    def start_component(self, rank: int) -> None: ...
    def grow_head(self, num_classes: int) -> None: ...
    def set_trainable(self) -> None: ...


def learned_state(model: LoRASumViT) -> dict[str, Tensor]:
    """``model``'s state without the backbone's own weights: components, method parameters, head, class masks."""
    frozen = {name for name, _ in model.backbone.named_parameters() if ".components." not in name}
    frozen |= {name for name, _ in model.backbone.named_buffers() if ".components." not in name}
    return {k: v for k, v in model.state_dict().items()
            if not (k.startswith("backbone.") and k.removeprefix("backbone.") in frozen)}


def load_learned_state(model: LoRASumViT, state: dict[str, Tensor]) -> None:
    """Load :func:`learned_state` into ``model``: its components and head grown to the state's first; a
    state that still does not fit (missing or unexpected entries) is refused naming them."""
    ranks = {int(m.group(1)): state[k].shape[1] for k in state if (m := _COMPONENT_A.match(k))}
    for index in range(model.num_experts, len(ranks)):
        model.start_component(ranks[index])
    model.grow_head(state["head_weight"].shape[0])
    take_stored_shapes(model, state, "", ("finished", "trained_classes", "current_classes"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k in model.experts_state_dict()]
    if missing or unexpected:
        raise ValueError(f"the state does not fit this {type(model).__name__}: missing {missing}, "
                         f"unexpected {unexpected}")
    model.max_class_label = max(model.max_class_label, len(model.trained_classes))
    model.set_trainable()  # what trains follows the loaded state: nothing of a finished component
