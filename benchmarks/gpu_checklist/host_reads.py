"""Reads of tensors on the host, counted per training step and per evaluation batch.

On a GPU each ``Tensor.item``, ``__bool__``, ``__int__``, ``__float__``, ``__index__``, ``tolist``, ``cpu``,
``nonzero`` (also ``torch.nonzero``) or indexing with a boolean mask waits for the device to drain (a host sync;
``cpu`` only where the tensor is on the device, which a CPU run cannot tell, so every call counts); on a CPU they
cost nothing, so counting them there shows what a GPU would wait for. Not counted: data loading (the dataset's and the loader's host tensors) and
``torch.optim`` (Adam's step counters are host tensors on a GPU too). Used by the sync-budget tests
and by ``benchmarks.gpu_checklist``, which on a GPU feeds the same windows with the syncs that
``torch.cuda.set_sync_debug_mode`` reports.
"""

from __future__ import annotations

import traceback
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Optional

import torch
from avalanche.core import SupervisedPlugin

# Not numpy: a device tensor must go through cpu() first (numpy() of it raises), and that cpu() is counted.
READS = ("item", "__bool__", "__int__", "__float__", "__index__", "tolist", "cpu", "nonzero")
# Indexing with a boolean mask (x[mask], x[mask] = v) sizes its result from the mask's contents: a sync on a GPU.
MASKED = ("__getitem__", "__setitem__")
NOT_COUNTED = ("/torch/utils/data/", "/avalanche/benchmarks/", "/torch/optim/")  # host tensors, even on a GPU


class HostReads(SupervisedPlugin):
    """Reads counted per window, keyed by (what, file:line of the innermost Avalanche or package frame).

    A training window is one iteration; an evaluation window closes when the next opens, so the
    evaluator's metrics, which run after every plugin, are in it.
    """

    def __init__(self) -> None:
        super().__init__()
        self.counts: list[tuple[str, Counter]] = []
        self.window: Optional[Counter] = None
        self.kind = ""

    def record(self, what: str) -> None:
        if self.window is None:
            return
        stack = traceback.extract_stack()[:-2]
        if any(part in frame.filename for frame in stack for part in NOT_COUNTED):
            return
        frame = next((f for f in reversed(stack) if "avalanche" in f.filename), stack[-1])
        self.window[(what, f"{frame.filename.rsplit('/', 2)[-1]}:{frame.lineno}")] += 1

    def open(self, kind: str) -> None:
        self.close()
        self.kind, self.window = kind, Counter()

    def close(self) -> None:
        if self.window is not None:
            self.counts.append((self.kind, self.window))
        self.window = None

    def per(self, kind: str) -> list[Counter]:
        """The windows of one kind ("train", "eval", or one given to :meth:`open`)."""
        return [window for window_kind, window in self.counts if window_kind == kind]

    def before_training_iteration(self, strategy, **kwargs) -> None:
        self.open("train")

    def after_training_iteration(self, strategy, **kwargs) -> None:
        self.close()  # the step's callbacks have run

    def before_eval_iteration(self, strategy, **kwargs) -> None:
        self.open("eval")

    def after_eval_exp(self, strategy, **kwargs) -> None:
        self.close()


@contextmanager
def counting(reads: HostReads) -> Iterator[HostReads]:
    """Count every read of :data:`READS` into ``reads`` while the block runs."""
    originals = {name: getattr(torch.Tensor, name) for name in READS + MASKED}
    nonzero = torch.nonzero

    def wrapped(name: str):
        def read(tensor, *args, **kwargs):
            reads.record(name)
            return originals[name](tensor, *args, **kwargs)
        return read

    def masked(name: str):
        def index(tensor, key, *args):
            keys = key if isinstance(key, tuple) else (key,)
            if any(isinstance(part, torch.Tensor) and part.dtype == torch.bool for part in keys):
                reads.record(f"boolean mask ({name.strip('_')})")
            return originals[name](tensor, key, *args)
        return index

    def counted_nonzero(*args, **kwargs):
        reads.record("torch.nonzero")
        return nonzero(*args, **kwargs)

    for name in READS:
        setattr(torch.Tensor, name, wrapped(name))
    for name in MASKED:
        setattr(torch.Tensor, name, masked(name))
    torch.nonzero = counted_nonzero
    try:
        yield reads
    finally:
        torch.nonzero = nonzero
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
