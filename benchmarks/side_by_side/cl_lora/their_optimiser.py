"""The optimiser their per-batch sequence runs under: torch's SGD with their parameters and options, in one of
:data:`MODES`, keeping what the first batch's steps see."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor

MODES = ("deferred", "no-version-bump", "torch")


class RecordingSGD(torch.optim.SGD):
    """Torch's SGD with their parameters and options, under one of :data:`MODES`; keeps the gradients that
    the first batch's ``step()`` calls see and calls ``on_batch`` after each batch's last step."""

    def __init__(self, params: Any, mode: str, steps_per_batch: int, on_batch: Callable[[], None],
                 **options: Any) -> None:
        super().__init__(params, **options)
        self.mode, self.steps_per_batch, self.on_batch = mode, steps_per_batch, on_batch
        self.calls, self.first_batch = 0, []
        self._kept: dict[int, Optional[Tensor]] = {}

    def _parameters(self) -> list[Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        position = self.calls % self.steps_per_batch
        self.calls += 1
        if self.calls <= self.steps_per_batch:
            self.first_batch.append({id(p): p.grad.clone() for p in self._parameters() if p.grad is not None})
        if self.mode == "torch":
            super().step()
        elif self.mode == "no-version-bump":
            self._step_through_data()
        elif self.steps_per_batch == 2 and position == 0:  # deferred: keep the KD gradients, no step yet
            self._kept = {id(p): None if p.grad is None else p.grad.clone() for p in self._parameters()}
        elif self.steps_per_batch == 2:
            current = {id(p): p.grad for p in self._parameters()}
            for p in self._parameters():
                p.grad = self._kept[id(p)]
            super().step()  # step 1: the reweighted KD gradients, taken at the batch's parameters
            for p in self._parameters():
                p.grad = current[id(p)]
            super().step()  # step 2: cross-entropy and orthogonality, at the batch's parameters too
        else:
            super().step()
        if position == self.steps_per_batch - 1:
            self.on_batch()

    def _step_through_data(self) -> None:
        """SGD (momentum, weight decay, no dampening, no Nesterov) written through ``.data``: the update
        does not bump the parameters' version counters."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                d = p.grad.data
                if group["weight_decay"]:
                    d = d.add(p.data, alpha=group["weight_decay"])
                state = self.state[p]
                if state.get("momentum_buffer") is None:
                    state["momentum_buffer"] = d.clone()
                else:
                    state["momentum_buffer"].mul_(group["momentum"]).add_(d)
                p.data.add_(state["momentum_buffer"], alpha=-group["lr"])
