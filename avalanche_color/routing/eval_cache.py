"""A memo of unchanged evaluation work, reused across repeated evaluations.

Between two evaluations of a continual run, the routing features of a test image
do not change (the backbone is frozen, and so is the first expert once its
experience is over), and neither do the outputs of frozen experts. The memo
keys both by the image's bytes, so it is exact whatever the data pipeline does:
an image that comes back changed (random eval transforms) is a miss, never a
wrong answer. The model decides what may be stored (only what a frozen part
computed); the memo only looks up and stores.
"""

from __future__ import annotations

import hashlib
from typing import Callable

import torch
from torch import Tensor


def image_keys(x: Tensor) -> list[bytes]:
    """One content hash per image of the batch."""
    flat = x.detach().to("cpu").contiguous().view(x.shape[0], -1)
    return [hashlib.blake2b(row.numpy().tobytes(), digest_size=16).digest() for row in flat]


class EvalCache:
    """Routing features per image, and frozen experts' logits per (image, expert)."""

    def __init__(self) -> None:
        self.features: dict[bytes, Tensor] = {}
        self.logits: dict[tuple[bytes, int], Tensor] = {}
        self.hits = 0
        self.misses = 0

    def clear(self) -> None:
        self.features.clear()
        self.logits.clear()

    def routing_features(self, x: Tensor, keys: list[bytes], compute: Callable[[Tensor], Tensor]) -> Tensor:
        """``compute(x)``, with the rows of images seen before taken from the memo."""
        missing = [row for row, key in enumerate(keys) if key not in self.features]
        self._count(len(keys) - len(missing), len(keys))
        if missing:
            computed = compute(x[torch.tensor(missing, device=x.device)])
            for row, values in zip(missing, computed):
                self.features[keys[row]] = values
        return torch.stack([self.features[key] for key in keys])

    def predict(self, x: Tensor, keys: list[bytes], experts: Tensor, num_classes: int,
                compute: Callable[[Tensor, Tensor], Tensor], is_frozen: Callable[[int], bool]) -> Tensor:
        """``compute(x, experts)`` (global-class logits), reusing the rows of frozen experts seen before."""
        logits = x.new_full((len(keys), num_classes), float("-inf"))
        missing = []
        for row, key in enumerate(keys):
            cached = self.logits.get((key, int(experts[row])))
            if cached is None:
                missing.append(row)
            else:  # stored when fewer classes were known: those columns stay -inf
                logits[row, : len(cached)] = cached
        self._count(len(keys) - len(missing), len(keys))
        if missing:
            rows = torch.tensor(missing, device=x.device)
            logits[rows] = computed = compute(x[rows], experts[rows])
            for row, values in zip(missing, computed):
                expert = int(experts[row])
                if is_frozen(expert):
                    self.logits[(keys[row], expert)] = values
        return logits

    def _count(self, hits: int, total: int) -> None:
        self.hits += hits
        self.misses += total - hits
