"""CL-LoRA's update of one batch (``_init_train`` of ``models/cllora.py``; its schedule, ``CosineAnnealingLR``
stepped per epoch, is the strategies' ``restart_cosine_per_epoch``).

From the second experience on, the code takes two SGD steps per batch on one optimiser: step 1 on
the distillation loss alone, its gradient of each shared U reassigned row by row; step 2 on the
cross-entropy plus the orthogonality term. Its step 2 backpropagates a graph built before step 1;
current torch refuses that (the tensors it saved were changed in place), so here both gradients are
taken at the batch's parameters before step 1, which is what the code's graph describes
(:func:`two_step_gradients`). A parameter without a distillation gradient (the specific adapters,
the block weights) is left out of step 1, as SGD skips a ``None`` gradient: no decay, no momentum.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import torch
from torch import Tensor, nn

from avalanche_color.peers.cl_lora.losses import reassignment_weights

Gradients = list[Optional[Tensor]]


def two_step_gradients(parameters: Sequence[nn.Parameter], loss: Tensor, kd_loss: Tensor,
                       shared_up: Sequence[nn.Parameter], teacher_up: Tensor) -> tuple[Gradients, Gradients]:
    """(step 1's gradients: the distillation's, reassigned; step 2's: ``loss``'s), both at the current
    parameters, in the order of ``parameters``."""
    second = list(torch.autograd.grad(loss, parameters, retain_graph=True, allow_unused=True))
    first = list(torch.autograd.grad(kd_loss, parameters, allow_unused=True))
    position = {id(p): i for i, p in enumerate(parameters)}
    for index, up in enumerate(shared_up):
        i = position[id(up)]
        if first[i] is not None:
            first[i] = first[i] * reassignment_weights(teacher_up[index]).unsqueeze(-1).to(first[i].dtype)
    return first, second


def set_gradients(parameters: Sequence[nn.Parameter], gradients: Gradients) -> None:
    for parameter, gradient in zip(parameters, gradients):
        parameter.grad = gradient
