"""Counting memory: what one training step holds beyond the weights, and the bytes of a learned state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class StepMemory:
    """Bytes one training step holds beyond the weights.

    On CPU, its parts: ``saved`` (what autograd saves for the backward pass, each storage once, the
    parameters' own storages left out), ``gradients`` and ``optimiser`` state. On CUDA only the total
    is known (the allocator's peak during the step minus what was allocated before); the parts are None.
    """

    total: int
    saved: Optional[int] = None
    gradients: Optional[int] = None
    optimiser: Optional[int] = None


def step_memory(step: Callable[[], object], model: nn.Module, optimizer: torch.optim.Optimizer,
                device: torch.device) -> StepMemory:
    """What ``step`` (zero_grad, forward, backward, optimiser step) holds beyond ``model``'s weights."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        torch.cuda.synchronize(device)
        return StepMemory(torch.cuda.max_memory_allocated(device) - before)
    saved: dict[int, int] = {}

    def pack(tensor: Tensor) -> Tensor:
        storage = tensor.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    # A parameter saved for backward (a frozen weight, an expert's A) costs nothing more: it is a weight.
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        step()
    activations = sum(size for ptr, size in saved.items() if ptr not in parameters)
    gradients = sum(p.grad.nbytes for p in model.parameters() if p.grad is not None)
    state = sum(t.nbytes for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))
    return StepMemory(activations + gradients + state, activations, gradients, state)


def training_memory(step: Callable[[], object], model: nn.Module, optimizer: torch.optim.Optimizer,
                    device: torch.device) -> int:
    """Bytes a training step holds beyond the weights (:func:`step_memory`'s total)."""
    return step_memory(step, model, optimizer, device).total


def state_bytes(state: dict[str, Tensor]) -> int:
    """Bytes of a state dict's tensors, as saved (each tensor in full)."""
    return sum(t.nbytes for t in state.values())
