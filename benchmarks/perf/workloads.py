"""What the benchmark runs: a CoLoR model with trained-looking experts, peft's counterpart, memory counting."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from avalanche_color import ExpertViT


def build_color(vit: nn.Module, experts: int, rank: int, classes: int, k: int, device: torch.device) -> ExpertViT:
    """``experts`` experts of ``classes`` classes each, with non-zero B and random prototypes."""
    model = ExpertViT(vit, rank=rank)
    generator = torch.Generator().manual_seed(0)
    for expert in range(experts):
        model.add_expert(list(range(expert * classes, (expert + 1) * classes)), experience=expert)
        with torch.no_grad():  # as if trained: B != 0, so the LoRA path does real work
            for layer in model.qkv_layers:
                layer.experts[expert].B.normal_(0, 0.02, generator=generator)
        centres = torch.nn.functional.normalize(torch.randn(k, model.num_features, generator=generator), dim=-1)
        model.router.set_prototypes(expert, centres)
    return model.to(device)


def peft_adapters(vit: nn.Module, adapters: int, rank: int) -> nn.Module:
    """The same ViT with ``adapters`` peft LoRA adapters (``expert0``, ...) on every fused qkv.

    ``target_modules=["qkv"]`` matches each block's ``attn.qkv`` linear layer, so peft
    adapts q, k and v (it cannot leave k out of a fused layer): A is r x d, B is 3d x r.
    Scaling 1, as ours (alpha = rank); random B, so the adapters do real work.
    """
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=rank, target_modules=["qkv"], lora_dropout=0.0, init_lora_weights=False)
    model = get_peft_model(vit, config, adapter_name="expert0")
    for adapter in range(1, adapters):
        model.add_adapter(f"expert{adapter}", config)
    adapted = [name for name, module in model.named_modules()
               if name.endswith("attn.qkv") and hasattr(module, "lora_A")]
    if len(adapted) != len(vit.blocks):
        raise RuntimeError(f"peft adapted {len(adapted)} qkv layers, the ViT has {len(vit.blocks)} blocks")
    return model.eval()


def training_memory(step: Callable[[], object], model: nn.Module, optimizer: torch.optim.Optimizer,
                    device: torch.device) -> int:
    """Bytes a training step holds beyond the weights.

    On CUDA: the allocator's peak during the step minus what was allocated before.
    On CPU (no allocator statistics): what autograd saves for the backward pass
    (each storage once) plus gradients plus optimiser state, counted from the tensors.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        step()
    activations = sum(size for ptr, size in saved.items() if ptr not in parameters)
    gradients = sum(p.grad.nbytes for p in model.parameters() if p.grad is not None)
    state = sum(t.nbytes for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))
    return activations + gradients + state
