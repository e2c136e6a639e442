"""CoLoR on several processes: torchrun + DistributedDataParallel + Avalanche's ``DistributedHelper``.

Launch with ``torchrun --nproc_per_node=N`` and call :func:`init_distributed` (Avalanche's
``DistributedHelper.init_distributed`` with each rank on its own node's GPU, ``cuda:{LOCAL_RANK}``:
Avalanche's own picks ``cuda:{RANK}``, a GPU that does not exist from the second node on) before
building the strategy, on the device it returns; without it everything here is a no-op and
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
* inside a training step, nothing is read on the host (no sync per step), and without torchrun each is
  the identity: :func:`average_gradients`, a step taken outside DDP (CL-LoRA's two per batch, from
  ``autograd.grad``) on the gradients averaged over the ranks, as DDP's reducer would give them;
  :func:`gather_padded_rows`, a loss over every rank's batch (LoRA subtraction's triplet loss, whose
  hardest pairs one process searches over the whole batch), differentiable.
* collectives: tensors only, through ``dist.all_gather``, ``dist.all_reduce`` and ``dist.broadcast`` (shapes first,
  then the data), on the GPU under NCCL and as CPU copies under gloo: no tensor is pickled (a
  pickled CUDA tensor lands on the device it was saved from, cuda:0, on every rank).
* evaluation: :func:`eval_loader` gives each rank a contiguous, unpadded shard
  in the same number of batches on every rank, and :func:`gather_eval_batch`
  replaces each batch's outputs, labels, task labels and routed experts
  (the strategy's ``mb_routed_experts``) with those of all ranks. Every metric (accuracy, loss, routing
  accuracy, ...) then
  sees the whole test stream exactly once, on every rank; Avalanche's own
  loggers write on rank 0 only.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Iterable, Mapping, Sequence
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


def local_device(use_cuda: bool, environ: Mapping[str, str] = os.environ) -> torch.device:
    """This process's device: under torchrun with CUDA, ``cuda:{LOCAL_RANK}``, the rank's GPU on its own
    node (``RANK`` counts over all nodes, so ``cuda:{RANK}`` does not exist from the second node on);
    ``cuda`` (the current GPU) without torchrun; ``cpu`` without CUDA."""
    if not use_cuda:
        return torch.device("cpu")
    local_rank = environ.get("LOCAL_RANK")
    if local_rank is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cuda")
    return torch.device("cuda", int(local_rank))


def init_distributed(seed: int, backend: Optional[str] = None) -> torch.device:
    """Avalanche's ``DistributedHelper.init_distributed`` under torchrun, every rank on its own node's GPU.

    ``backend``: ``"nccl"`` or ``"gloo"``; None: NCCL where CUDA is available, else gloo. Under
    NCCL each rank's current CUDA device is set to ``cuda:{LOCAL_RANK}`` before the process group
    starts, and ``DistributedHelper.make_device`` (which Avalanche's own collectives and its device
    map for unpickled tensors use) answers the same device from then on. Returns the device to build
    the strategy on.
    """
    use_cuda = torch.cuda.is_available() and backend != "gloo"
    backend = backend or ("nccl" if use_cuda else "gloo")
    if use_cuda:
        torch.cuda.set_device(local_device(True))

    def make_device(set_cuda_device: bool = False) -> torch.device:
        device = local_device(bool(DistributedHelper.use_cuda))
        if set_cuda_device and device.type == "cuda":
            torch.cuda.set_device(device)
        return device

    # An instance attribute: Avalanche's helper is a singleton whose methods call self.make_device(); to a type
    # checker that reads Avalanche, _DistributedHelperCls.make_device is a method, which no assignment may replace.
    DistributedHelper.make_device = make_device  # type: ignore[method-assign]  # Avalanche's _DistributedHelperCls
    DistributedHelper.init_distributed(seed, backend=backend, use_cuda=use_cuda)
    return make_device()


def communication_device() -> torch.device:
    """Where a tensor must be for the process group's backend: the current GPU under NCCL, the CPU under gloo."""
    if torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def row_counts(rows: int) -> list[int]:
    """Every rank's ``rows``, in rank order: one ``all_gather`` of one int64 per rank, and one host sync to read
    them (``[rows]`` when not distributed)."""
    if not is_distributed():
        return [rows]
    count = torch.tensor([rows], dtype=torch.int64, device=communication_device())
    counts = [torch.empty_like(count) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(counts, count)
    return torch.cat(counts).tolist()


def gather_rows(tensor: Tensor, sizes: Optional[list[int]] = None) -> Tensor:
    """Every rank's rows of ``tensor`` (same shape after the first dimension, same dtype on every rank),
    concatenated in rank order, on ``tensor``'s device; ``tensor`` itself when not distributed.

    The rows padded to the largest count go through one ``all_gather``; the counts are ``sizes`` (every
    rank's, from :func:`row_counts`, so that tensors of equal counts share one read) or gathered first (one
    more ``all_gather`` and a host sync).
    """
    if not is_distributed():
        return tensor
    world = torch.distributed.get_world_size()
    device = communication_device()
    if sizes is None:
        sizes = row_counts(tensor.shape[0])
    if len(sizes) != world or sizes[torch.distributed.get_rank()] != tensor.shape[0]:
        raise ValueError(f"sizes must hold every rank's row count ({world}, this rank's {tensor.shape[0]}), "
                         f"got {sizes}")
    largest = max(sizes)
    padded = tensor.new_zeros((largest, *tensor.shape[1:]), device=device)
    padded[: tensor.shape[0]] = tensor.to(device)
    gathered = [torch.empty_like(padded) for _ in range(world)]
    torch.distributed.all_gather(gathered, padded)
    return torch.cat([rows[:size] for rows, size in zip(gathered, sizes)]).to(tensor.device)


_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool,
           torch.uint8)
_MAX_DIMS = 8


def broadcast_tensor(tensor: Optional[Tensor], device: torch.device, src: int = 0) -> Tensor:
    """Rank ``src``'s ``tensor`` on every rank, on ``device`` (other ranks give None); ``tensor`` itself
    when not distributed. The dtype and shape go first (one int64 tensor), then the data, through
    ``dist.broadcast``: nothing is pickled."""
    if not is_distributed():
        if tensor is None:
            raise ValueError("broadcast_tensor needs the tensor when not distributed")
        return tensor.to(device)
    placement = communication_device()
    header = torch.zeros(2 + _MAX_DIMS, dtype=torch.int64, device=placement)  # dtype, dims, shape
    if torch.distributed.get_rank() == src:
        if tensor is None:
            raise ValueError(f"rank {src} broadcasts: it must give the tensor, got None")
        if tensor.dtype not in _DTYPES or tensor.dim() > _MAX_DIMS:
            raise ValueError(f"broadcast_tensor takes up to {_MAX_DIMS} dimensions of a dtype in {_DTYPES}, "
                             f"got {tensor.dtype} with shape {tuple(tensor.shape)}")
        header[0], header[1] = _DTYPES.index(tensor.dtype), tensor.dim()
        header[2: 2 + tensor.dim()] = torch.tensor(tensor.shape)
        torch.distributed.broadcast(header, src)
        data = tensor.to(placement).contiguous()
    else:
        torch.distributed.broadcast(header, src)
        dtype_index, dims, *shape = header.tolist()
        data = torch.empty(shape[:dims], dtype=_DTYPES[dtype_index], device=placement)
    torch.distributed.broadcast(data, src)
    return data.to(device)


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


def eval_row_counts(num_samples: int, batch_size: int, world_size: int) -> list[list[int]]:
    """Every rank's row count of each evaluation batch, batch by batch (:func:`eval_batches` of every rank): each
    rank computes them alike on the host, so gathering an evaluation batch reads nothing from the device."""
    per_rank = [[len(batch) for batch in eval_batches(num_samples, batch_size, rank, world_size)]
                for rank in range(world_size)]
    return [list(sizes) for sizes in zip(*per_rank)]


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
    return gather_rows(features)


def on_main_process(fit: Callable[[Tensor, Tensor], Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
    """``fit(features, labels)`` run once, on rank 0 (every rank holds the same gathered samples),
    its result broadcast to every rank; ``fit`` itself when not distributed."""
    if not is_distributed():
        return fit

    def fit_once(features: Tensor, labels: Tensor) -> Tensor:
        centres = fit(features, labels) if DistributedHelper.is_main_process else None
        return broadcast_tensor(centres, features.device)

    return fit_once


@torch.no_grad()
def gather_eval_batch(strategy: "SupervisedTemplate", sizes: Optional[list[int]] = None) -> None:
    """Replace the batch's outputs, labels, task labels and routed experts (``strategy.mb_routed_experts``)
    with those of all ranks. ``sizes``: every rank's row count of this batch, where every rank knows them
    (:func:`eval_row_counts`); None: gathered, with one host read."""
    if not is_distributed():
        return
    local = len(strategy.mb_output)
    if sizes is None:
        sizes = row_counts(local)  # one read of the counts for the batch's tensors, all of ``local`` rows
    strategy.mb_output = gather_rows(strategy.mb_output, sizes)
    for index in range(1, len(strategy.mbatch)):  # mbatch[0] (the images) stays local
        strategy.mbatch[index] = gather_rows(strategy.mbatch[index], sizes)
    routed = getattr(strategy, "mb_routed_experts", None)
    if routed is not None and len(routed) == local:
        strategy.mb_routed_experts = gather_rows(routed, sizes)


# ---------------------------------------------------------------------- inside a training step


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
