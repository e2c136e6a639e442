"""Collectives inside a training step, under torchrun: nothing is read on the host (no sync per step), and
without torchrun each is the identity.

* :func:`average_gradients`: a step taken outside DDP (CL-LoRA's two per batch, from ``autograd.grad``)
  on the gradients averaged over the ranks, as DDP's reducer would give them.
* :func:`gather_padded_rows`: a loss over every rank's batch (LoRA subtraction's triplet loss, whose
  hardest pairs one process searches over the whole batch), differentiable.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Optional

import torch
from torch import Tensor, nn

from avalanche_color.training.distributed import communication_device, is_distributed


def gather_padded_rows(tensor: Tensor, rows: int) -> tuple[Tensor, Tensor]:
    """Every rank's rows of ``tensor`` (at most ``rows`` on each; same shape after the first dimension and
    dtype on every rank), each rank's padded with zeros to ``rows``, concatenated in rank order, and which
    rows are real (bool, ``world * rows``); on ``tensor``'s device. Not distributed: ``tensor`` and all True.

    Differentiable (``torch.distributed.nn.functional.all_gather``): the backward sums, into this rank's
    rows, the gradients that every rank's loss sends to them. The row counts stay on the device, so
    unlike :func:`gather_rows` nothing is read on the host (a training step's gather).
    """
    if tensor.shape[0] > rows:
        raise ValueError(f"gather_padded_rows pads to rows={rows}, got a tensor of {tensor.shape[0]} rows")
    if not is_distributed():
        return tensor, torch.ones(tensor.shape[0], dtype=torch.bool, device=tensor.device)
    from torch.distributed.nn.functional import all_gather  # the differentiable one

    device = communication_device()
    padded = nn.functional.pad(tensor.to(device), (0, 0) * (tensor.dim() - 1) + (0, rows - tensor.shape[0]))
    count = torch.full((1,), tensor.shape[0], dtype=torch.int64, device=device)
    counts = torch.cat(all_gather(count))
    real = torch.arange(rows, device=device)[None, :] < counts[:, None]
    return torch.cat(all_gather(padded)).to(tensor.device), real.flatten().to(tensor.device)


def average_gradients(gradients: Sequence[Optional[Tensor]]) -> list[Optional[Tensor]]:
    """Each gradient's mean over the ranks, for a step taken outside DDP; ``gradients`` as they are when not
    distributed. Every rank must give None at the same places (None stays None).

    One ``all_reduce`` (sum) over the gradients flattened into one bucket, divided by the world size;
    nothing is read on the host. The bucket is in the gradients' promoted dtype, each result back in its own.
    """
    present = [gradient for gradient in gradients if gradient is not None]
    if not is_distributed() or not present:
        return list(gradients)
    dtype = functools.reduce(torch.promote_types, (gradient.dtype for gradient in present))
    bucket = torch.cat([gradient.detach().reshape(-1).to(communication_device(), dtype) for gradient in present])
    torch.distributed.all_reduce(bucket)
    bucket /= torch.distributed.get_world_size()
    averaged = iter(bucket.split([gradient.numel() for gradient in present]))
    return [None if gradient is None else next(averaged).view_as(gradient).to(gradient.device, gradient.dtype)
            for gradient in gradients]
