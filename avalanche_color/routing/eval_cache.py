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
from typing import Any, Callable

import torch
from torch import Tensor


def image_keys(x: Tensor) -> list[bytes]:
    """One content key per image of the batch.

    On the CPU, a BLAKE2b hash of the image's bytes. On an accelerator the batch is not
    copied to the host: a 128-bit hash is computed on the device (:func:`device_digests`)
    and only those 16 bytes per image are copied. That copy still waits for the device,
    as any key that a Python dict can look up must; it no longer moves the images.
    """
    if x.device.type != "cpu":
        return [row.tobytes() for row in device_digests(x).cpu().numpy()]
    flat = x.detach().contiguous().view(x.shape[0], -1)
    return [hashlib.blake2b(row.numpy().tobytes(), digest_size=16).digest() for row in flat]


_MIX = (0x9E3779B97F4A7C15 - (1 << 64), 0xBF58476D1CE4E5B9 - (1 << 64), 0x94D049BB133111EB - (1 << 64))


def device_digests(x: Tensor) -> Tensor:
    """(batch, 2) int64: two 64-bit hashes of each image's bytes, computed where ``x`` lives.

    Every 4-byte word is mixed with its position (a splitmix64-style finaliser, so that
    flipping any bit changes about half the bits of its term) and the terms are summed;
    the two hashes use different position offsets.
    """
    raw = x.detach().contiguous().view(x.shape[0], -1)
    if raw.element_size() != 4 or raw.shape[1] * raw.element_size() % 4:
        raw = raw.view(torch.uint8).view(x.shape[0], -1)
        raw = torch.nn.functional.pad(raw, (0, -raw.shape[1] % 4)).view(torch.int32)
    words = raw.view(torch.int32).to(torch.int64)
    positions = torch.arange(words.shape[1], device=x.device, dtype=torch.int64)
    return torch.stack([_mix(words + (positions + 1) * _MIX[0]).sum(1),
                        _mix(words ^ ((positions + 7) * _MIX[2])).sum(1)], dim=1)


def _mix(z: Tensor) -> Tensor:
    z = (z ^ (z >> 30)) * _MIX[1]
    z = (z ^ (z >> 27)) * _MIX[2]
    return z ^ (z >> 31)


class EvalCache:
    """Routing features per image, and frozen experts' logits per (image, expert), within a memory bound.

    Args:
        max_bytes: the most memory the stored tensors take, half for the routing features and half
            for the logits; past it the oldest entries go first (default 1 GiB: the routing features
            of about 170,000 images of a ViT-B/16).
    """

    def __init__(self, max_bytes: int = 2**30) -> None:
        self.max_bytes = max_bytes
        self.features: dict[bytes, Tensor] = {}
        self.logits: dict[tuple[bytes, int], Tensor] = {}
        self._bytes = {"features": 0, "logits": 0}
        self.hits = 0
        self.misses = 0

    def clear(self) -> None:
        self.features.clear()
        self.logits.clear()
        self._bytes = {"features": 0, "logits": 0}

    def routing_features(self, x: Tensor, keys: list[bytes], compute: Callable[[Tensor], Tensor]) -> Tensor:
        """``compute(x)``, with the rows of images seen before taken from the memo."""
        rows = {row: self.features[key] for row, key in enumerate(keys) if key in self.features}
        missing = [row for row in range(len(keys)) if row not in rows]
        self._count(len(rows), len(keys))
        if missing:
            computed = compute(x[torch.tensor(missing, device=x.device)])
            for row, values in zip(missing, computed):
                rows[row] = values
                self._store("features", keys[row], values)
        return torch.stack([rows[row] for row in range(len(keys))])

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
                    self._store("logits", (keys[row], expert), values)
        return logits

    def _store(self, memo_name: str, key: Any, values: Tensor) -> None:
        """Keep ``values`` under ``key``; the oldest entries of that memo go while it is over its half."""
        memo: dict[Any, Tensor] = getattr(self, memo_name)
        if key in memo:
            self._bytes[memo_name] -= _size(memo.pop(key))
        memo[key] = values = values.clone()  # its own memory: a row view would keep its whole batch
        self._bytes[memo_name] += _size(values)
        while self._bytes[memo_name] > self.max_bytes // 2 and len(memo) > 1:
            self._bytes[memo_name] -= _size(memo.pop(next(iter(memo))))

    def _count(self, hits: int, total: int) -> None:
        self.hits += hits
        self.misses += total - hits


def _size(values: Tensor) -> int:
    return values.numel() * values.element_size()
