"""One linear head per expert, over the classes of its experience."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import torch
from torch import Tensor, nn

from avalanche_color.lora.stacked import cached_stacks, pad_dim, source_key, with_live_slot


def check_classes(classes: Sequence[int]) -> None:
    """Refuse an empty class list or negative class ids."""
    if len(classes) == 0:
        raise ValueError("classes must name at least one class, got an empty sequence")
    if min(classes) < 0:
        raise ValueError(f"classes must be non-negative class ids, got {sorted(classes)}")


class ExpertHead(nn.Module):
    """A linear head over the classes of one experience.

    ``classes`` maps the head's outputs to the global class ids.
    """

    classes: Tensor

    def __init__(self, in_features: int, classes: Sequence[int]) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, len(classes))
        self.register_buffer("classes", torch.as_tensor(sorted(classes), dtype=torch.long))

    def forward(self, features: Tensor) -> Tensor:
        """Logits in the head's dtype (float32 beside a bfloat16 backbone: its features are cast up)."""
        return self.linear(features.to(self.linear.weight.dtype))


def gathered_head_logits(heads: nn.ModuleList, features: Tensor, experts: Tensor, num_classes: int,
                         trained: Optional[int] = None) -> Tensor:
    """Global-class logits (batch, num_classes) of each sample's expert's head on its ``features``, -inf
    where that head has no class.

    One padded batched matmul for every head at once (fixed shapes, no host sync): the heads are stacked,
    padded to the largest class count, each sample's head gathered by its expert index; padded outputs
    are written to a spare column that is dropped. ``trained``'s head is used live, so gradients reach it.
    """
    weight, bias, columns = stacked_heads(heads, trained)
    features = features.to(weight.dtype)  # a bfloat16 backbone's, up to the heads' float32
    outputs = torch.baddbmm(bias.index_select(0, experts).unsqueeze(2), weight.index_select(0, experts),
                            features.unsqueeze(2)).squeeze(2)
    columns = columns.index_select(0, experts)
    columns = torch.where(columns < 0, num_classes, columns)  # padding -> the spare column
    logits = features.new_full((features.shape[0], num_classes + 1), float("-inf"))
    logits.scatter_(1, columns, outputs.to(logits.dtype))  # under autocast the heads may compute in another dtype
    return logits[:, :num_classes].contiguous()


def stacked_heads(heads: nn.ModuleList, trained: Optional[int] = None) -> tuple[Tensor, Tensor, Tensor]:
    """Every head stacked and padded to the largest class count C: weights (E, C, features), biases (E, C)
    and class ids (E, C), -1 where padded. Cached until a head changes; ``trained``'s slot is live."""
    width = max(len(head.classes) for head in heads)
    frozen = [head for index, head in enumerate(heads) if index != trained]
    live_head = None if trained is None else heads[trained].linear
    live = () if live_head is None else (trained, live_head.weight.dtype, live_head.weight.device)
    key = source_key([t for head in frozen for t in (head.linear.weight, head.linear.bias, head.classes)],
                     len(heads), *live)
    weight, bias, columns = cached_stacks(heads, key, lambda: (
        torch.stack([pad_dim(head.linear.weight, 0, width) for head in heads]),
        torch.stack([pad_dim(head.linear.bias, 0, width) for head in heads]),
        torch.stack([pad_dim(head.classes + 1, 0, width) - 1 for head in heads])))
    if live_head is None:
        return weight, bias, columns
    return (with_live_slot(weight, trained, pad_dim(live_head.weight, 0, width)),
            with_live_slot(bias, trained, pad_dim(live_head.bias, 0, width)), columns)
