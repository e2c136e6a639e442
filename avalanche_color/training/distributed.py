"""CoLoR on several processes: torchrun + DistributedDataParallel + Avalanche's ``DistributedHelper``.

Launch with ``torchrun --nproc_per_node=N`` and call
``DistributedHelper.init_distributed(seed, backend=...)`` (gloo on CPU, NCCL on
GPUs) before building the strategy; without it everything here is a no-op and
single-process runs are unchanged. What each part does:

* training: Avalanche's loader already gives each rank a ``DistributedSampler``
  shard; :func:`wrap_current_expert` wraps the model in DDP once the
  experience's expert exists, with every frozen weight and buffer ignored, so
  DDP syncs and all-reduces only the current expert (no
  ``find_unused_parameters``).
* routers: :func:`gather_features` concatenates every rank's routing features in
  rank order (the single-process order, as the shards are contiguous); every rank fits
  its router from them, and :func:`on_main_process` runs k-means once, on rank 0, and
  broadcasts the centres, so every rank holds the same prototypes.
* evaluation: :func:`eval_loader` gives each rank a contiguous, unpadded shard
  in the same number of batches on every rank, and :func:`gather_eval_batch`
  replaces each batch's outputs, labels, task labels and routed experts
  (the model's ``routed_experts``) with those of all ranks. Every metric (accuracy, loss, routing accuracy, ...) then
  sees the whole test stream exactly once, on every rank; Avalanche's own
  loggers write on rank 0 only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
from avalanche.benchmarks.utils.data_loader import collate_from_data_or_kwargs
from avalanche.distributed import DistributedHelper
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from avalanche_color.config import LoaderOptions
from avalanche_color.experts.routed_vit import RoutedExpertViT
from avalanche_color.training.loaders import data_loader

if TYPE_CHECKING:
    from avalanche.training.templates import SupervisedTemplate


def is_distributed() -> bool:
    """Whether this process is one of several (``DistributedHelper.init_distributed`` was called under torchrun)."""
    return bool(DistributedHelper.is_distributed)


def shard(num_samples: int, rank: int, world_size: int) -> range:
    """This rank's contiguous part of ``range(num_samples)``; sizes differ by at most one."""
    base, extra = divmod(num_samples, world_size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (rank < extra))


def eval_batches(num_samples: int, batch_size: int, rank: int, world_size: int) -> list[list[int]]:
    """This rank's shard split into as many batches as every other rank's (about ``batch_size`` each).

    Equal batch counts keep the per-batch gathers of all ranks in step.
    """
    if num_samples < world_size:
        raise ValueError(
            f"an evaluation experience needs at least one sample per rank: {num_samples} samples, "
            f"{world_size} ranks"
        )
    count = math.ceil(math.ceil(num_samples / world_size) / batch_size)
    indices = torch.tensor(shard(num_samples, rank, world_size))
    count = min(count, num_samples // world_size)  # no empty batch on any rank
    return [chunk.tolist() for chunk in indices.tensor_split(count)]


def eval_loader(dataset: Any, batch_size: int, options: Optional[LoaderOptions] = None,
                device: torch.device = torch.device("cpu")) -> DataLoader:
    """A loader over this rank's evaluation shard (see :func:`eval_batches`), with the loader ``options``."""
    collate: dict[str, Any] = {}
    collate_from_data_or_kwargs(dataset, collate)
    batches = eval_batches(len(dataset), batch_size, DistributedHelper.rank, DistributedHelper.world_size)
    return data_loader(dataset, options or LoaderOptions(), device, batch_sampler=batches, **collate)


def wrap_current_expert(model: nn.Module, trainable: Optional[Iterable[nn.Parameter]] = None
                        ) -> Optional[DistributedDataParallel]:
    """``model`` in DDP over the ``trainable`` parameters only (a routed model's: those of the expert that
    trains; another model's, by default: those that require gradients); None if not distributed."""
    if not is_distributed():
        return None
    if trainable is None and isinstance(model, RoutedExpertViT):
        trainable = () if model.bank.trainable is None else model.expert_parameters(model.bank.trainable)
    elif trainable is None:
        trainable = (p for p in model.parameters() if p.requires_grad)
    own = {id(p) for p in trainable}
    frozen = [name for name, p in model.named_parameters() if id(p) not in own]
    frozen += [name for name, _ in model.named_buffers()]
    # Frozen weights and buffers (prototypes, class maps) are neither broadcast nor reduced.
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, frozen)
    device = next(model.parameters()).device
    return DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)


def gather_features(features: Tensor) -> Tensor:
    """Every rank's rows, concatenated in rank order (``features`` itself when not distributed)."""
    return DistributedHelper.cat_all(features) if is_distributed() else features


def on_main_process(fit: Callable[[Tensor, Tensor], Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
    """``fit(features, labels)`` run once, on rank 0 (every rank holds the same gathered samples),
    its result broadcast to every rank; ``fit`` itself when not distributed."""
    if not is_distributed():
        return fit

    def fit_once(features: Tensor, labels: Tensor) -> Tensor:
        centres = fit(features, labels) if DistributedHelper.is_main_process else None
        return DistributedHelper.broadcast_object(centres).to(features.device)

    return fit_once


@torch.no_grad()
def gather_eval_batch(strategy: "SupervisedTemplate") -> None:
    """Replace the batch's outputs, labels, task labels and routed experts (``strategy.model.routed_experts``)
    with those of all ranks."""
    if not is_distributed():
        return
    local = len(strategy.mb_output)
    strategy.mb_output = DistributedHelper.cat_all(strategy.mb_output)
    for index in range(1, len(strategy.mbatch)):  # mbatch[0] (the images) stays local
        strategy.mbatch[index] = DistributedHelper.cat_all(strategy.mbatch[index])
    model = strategy.model
    if isinstance(model, RoutedExpertViT) and model.routed_experts is not None and len(model.routed_experts) == local:
        model.routed_experts = DistributedHelper.cat_all(model.routed_experts)
