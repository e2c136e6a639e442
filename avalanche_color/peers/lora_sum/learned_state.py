"""What a LoRA-peer model has learned, as a state dict without the frozen backbone, and loading one back
into a model whose structure grows to fit it first (components, head rows, class masks)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from torch import Tensor

from avalanche_color.utils.state import take_stored_shapes

if TYPE_CHECKING:  # the model calls these functions; a type hint only
    from avalanche_color.peers.lora_sum.model import LoRASumViT

# The first block's A of each component: the components' ranks, in order.
_COMPONENT_A = re.compile(r"^backbone\.blocks\.0\.attn\.qkv\.components\.(\d+)\.A$")


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
