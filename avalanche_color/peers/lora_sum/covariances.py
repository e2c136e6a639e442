"""The input covariance of every LoRA-sum layer over a pass of data: what InfLoRA designs its ``A_t`` from
and what LoRA subtraction's projection is made from."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn


class CovarianceSum:
    """Running ``sum x x^T`` (float64) and token count of one layer's inputs."""

    def __init__(self, width: int, device: torch.device) -> None:
        self.sum = torch.zeros(width, width, dtype=torch.float64, device=device)
        self.count = 0

    def add(self, x: Tensor) -> None:
        tokens = x.detach().reshape(-1, x.shape[-1]).to(torch.float64)
        self.sum += tokens.T @ tokens
        self.count += tokens.shape[0]

    def mean(self) -> Tensor:
        return self.sum / max(self.count, 1)


@contextmanager
def input_covariances(layers: Sequence[nn.Module]) -> Iterator[list[CovarianceSum]]:
    """While open, every forward adds each layer's inputs to that layer's :class:`CovarianceSum`."""
    sums = [CovarianceSum(layer.in_features, layer.base_layer.weight.device) for layer in layers]
    handles = [layer.register_forward_pre_hook(lambda _, args, s=s: s.add(args[0]))
               for layer, s in zip(layers, sums)]
    try:
        yield sums
    finally:
        for handle in handles:
            handle.remove()
