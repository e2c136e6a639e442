"""A memo of unchanged evaluation work, reused across repeated evaluations.

Between two evaluations of a continual run, the routing features of a test image
do not change (the backbone is frozen, and so is the first expert once its
experience is over), and neither do the outputs of frozen experts. The memo
keys both by the image's bytes, so it is exact whatever the data pipeline does:
an image that comes back changed (random eval transforms) is a miss, never a
wrong answer. The model decides what may be stored (only what a frozen part
computed); the memo only looks up and stores.

The memo lives in host memory (the model's device keeps its memory for the model), within
a bound the strategy sets (``cache_evaluation_bytes``). Per batch it costs two host syncs
whatever the batch size and the number of experts: the images' keys, and the routed experts
(one ``tolist``); the rows found come back to the device in one copy, the rows computed go to
the host in one copy.
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
        max_bytes: the most host memory the stored tensors take, half for the routing features and
            half for the logits; past it the oldest entries go first (default 1 GiB: the routing
            features of about 170,000 images of a ViT-B/16).
    """

    def __init__(self, max_bytes: int = 2**30) -> None:
        if not (isinstance(max_bytes, int) and max_bytes > 0):
            raise ValueError(f"max_bytes must be a positive integer, got {max_bytes!r}")
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
        found = [row for row, key in enumerate(keys) if key in self.features]
        missing = [row for row, key in enumerate(keys) if key not in self.features]
        self._count(len(found), len(keys))
        if not missing:
            return _to_device(torch.stack([self.features[keys[row]] for row in found]), x.device)
        computed = compute(x[_rows(missing, x.device)])
        self._store_rows("features", [keys[row] for row in missing], computed)
        if not found:
            return computed
        features = computed.new_empty((len(keys), *computed.shape[1:]))
        features[_rows(missing, x.device)] = computed
        features[_rows(found, x.device)] = _to_device(torch.stack([self.features[keys[row]] for row in found]),
                                                      x.device).to(computed.dtype)
        return features

    def predict(self, x: Tensor, keys: list[bytes], experts: Tensor, num_classes: int,
                compute: Callable[[Tensor, Tensor], Tensor], is_frozen: Callable[[int], bool]) -> Tensor:
        """``compute(x, experts)`` (global-class logits), reusing the rows of frozen experts seen before."""
        expert_ids = experts.tolist()  # one host sync for the batch, not one per sample
        logits = x.new_full((len(keys), num_classes), float("-inf"))
        found, missing = [], []
        for row, (key, expert) in enumerate(zip(keys, expert_ids)):
            (found if (key, expert) in self.logits else missing).append(row)
        self._count(len(found), len(keys))
        if found:  # stored when fewer classes were known: those columns stay -inf
            stored = [self.logits[(keys[row], expert_ids[row])] for row in found]
            width = max(len(values) for values in stored)
            block = torch.full((len(found), width), float("-inf"), dtype=stored[0].dtype)
            for index, values in enumerate(stored):
                block[index, : len(values)] = values
            logits[_rows(found, x.device), :width] = _to_device(block, x.device).to(logits.dtype)
        if missing:
            rows = _rows(missing, x.device)
            logits[rows] = computed = compute(x[rows], experts[rows])
            frozen = [index for index, row in enumerate(missing) if is_frozen(expert_ids[row])]
            if frozen:
                self._store_rows("logits", [(keys[missing[i]], expert_ids[missing[i]]) for i in frozen],
                                 computed[_rows(frozen, computed.device)])
        return logits

    def _store_rows(self, memo_name: str, keys: list[Any], values: Tensor) -> None:
        """Keep each row of ``values`` under its key, in host memory (one copy from the device for all rows)."""
        for key, row in zip(keys, values.detach().to("cpu")):  # _store gives each row its own memory
            self._store(memo_name, key, row)

    def _store(self, memo_name: str, key: Any, values: Tensor) -> None:
        """Keep ``values`` under ``key``; the oldest entries of that memo go while it is over its half."""
        memo: dict[Any, Tensor] = getattr(self, memo_name)
        if key in memo:
            self._bytes[memo_name] -= _size(memo.pop(key))
        memo[key] = values = values.clone()  # its own (host) memory: a row view would keep its whole batch
        self._bytes[memo_name] += _size(values)
        while self._bytes[memo_name] > self.max_bytes // 2 and len(memo) > 1:
            self._bytes[memo_name] -= _size(memo.pop(next(iter(memo))))

    def _count(self, hits: int, total: int) -> None:
        self.hits += hits
        self.misses += total - hits


def _size(values: Tensor) -> int:
    return values.numel() * values.element_size()


def _rows(rows: list[int], device: torch.device) -> Tensor:
    return torch.tensor(rows, dtype=torch.long).to(device, non_blocking=True)


def _to_device(values: Tensor, device: torch.device) -> Tensor:
    """Host rows to ``device`` in one copy (page-locked first on CUDA, so the copy does not block the host)."""
    if device.type == "cuda":
        values = values.pin_memory()
    return values.to(device, non_blocking=device.type == "cuda")
