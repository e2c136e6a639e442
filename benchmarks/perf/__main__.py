"""Speed and memory of CoLoR's training and routed inference, as ratios measured side by side.

    python -m benchmarks.perf                      # ViT-B/16 shape, CPU (CUDA when present)
    python -m benchmarks.perf --batch-size 64 --device cuda

Everything runs in this one process on the same inputs: a warm-up, then the
median of repeated timings. Weights are random (timings do not depend on them).
Printed and written as a markdown table:

* R1 = CoLoR training step / frozen-backbone forward (ideal about 2.0)
* R2 = CoLoR training step / full fine-tuning step, and their training memory
* R3 = routed inference throughput / plain ViT forward throughput (ideal 0.5)
* R4 = routed inference time with 10 experts mixed in each batch / with 1 expert (ideal 1.0)
* R5 = our expert pass / peft's mixed-adapter batch (``adapter_names``), 10 experts
* routing (nearest prototype) and k-means fit time as a share of a forward
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import time
import warnings
from pathlib import Path
from typing import Callable

import timm
import torch
from torch import nn

from avalanche_color import ExpertViT, fit_prototypes

RESULTS = Path(__file__).parents[1] / "results"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(step: Callable[[], object], device: torch.device, repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        step()
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


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


def build_color(vit: nn.Module, experts: int, rank: int, classes: int, k: int, device: torch.device) -> ExpertViT:
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


def peft_mixed_batch(vit: nn.Module, experts: int, rank: int):
    """The same ViT with ``experts`` peft LoRA adapters on its fused qkv (peft adapts q, k and v)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=rank, target_modules=["qkv"], lora_dropout=0.0, init_lora_weights=False)
    model = get_peft_model(vit, config, adapter_name="expert0")
    for expert in range(1, experts):
        model.add_adapter(f"expert{expert}", config)
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit_base_patch16_224", help="timm model name (random weights)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rank", type=int, default=64)
    parser.add_argument("--experts", type=int, default=10)
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=RESULTS / "perf.md")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=".*adapter_names.*")

    device = torch.device(args.device)
    torch.manual_seed(0)
    make_vit = lambda: timm.create_model(args.model, pretrained=False, num_classes=0)  # noqa: E731
    plain = make_vit().to(device).eval()
    size = plain.patch_embed.img_size
    x = torch.randn(args.batch_size, 3, *size, device=device)
    classes = 10
    labels = torch.randint(0, classes, (args.batch_size,), device=device) + classes * (args.experts - 1)
    mixed = (torch.arange(args.batch_size, device=device) % args.experts)[torch.randperm(args.batch_size)]
    single = torch.zeros_like(mixed)
    model = build_color(make_vit(), args.experts, args.rank, classes, args.k, device)
    timings: dict[str, float] = {}
    repeat = lambda name, fn: timings.__setitem__(name, median_seconds(fn, device, args.repeats))  # noqa: E731

    # Inference: plain forward, routed (two passes), one expert vs ten mixed, routing alone.
    def routed_inference(experts: torch.Tensor) -> torch.Tensor:
        """model(x) with the routing pass as usual but a chosen mix of experts."""
        model.router(model.routing_features(x))
        return model.predict(x, experts)

    with torch.no_grad():
        model.eval()
        repeat("plain forward", lambda: plain(x))
        repeat("routed inference, 10 experts mixed", lambda: routed_inference(mixed))
        repeat("routed inference, 1 expert", lambda: routed_inference(single))
        repeat("expert pass, 10 experts mixed", lambda: model.predict(x, mixed))
        repeat("expert pass, 1 expert", lambda: model.predict(x, single))
        features = model.routing_features(x)
        repeat("routing (nearest prototype)", lambda: model.router(features))
    kmeans_features = torch.nn.functional.normalize(torch.randn(1000, model.num_features), dim=-1)
    start = time.perf_counter()
    fit_prototypes(kmeans_features, args.k, seed=0, n_init=10)
    timings["k-means fit (1000 samples)"] = time.perf_counter() - start

    # Training: CoLoR step (newest expert) against full fine-tuning of the same ViT.
    model.train()
    color_optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3, momentum=0.9)
    criterion = nn.CrossEntropyLoss()

    def color_step():
        color_optimizer.zero_grad(set_to_none=True)
        criterion(model(x), labels).backward()
        color_optimizer.step()

    full = timm.create_model(args.model, pretrained=False, num_classes=classes * args.experts).to(device).train()
    full_optimizer = torch.optim.SGD(full.parameters(), lr=1e-3, momentum=0.9)

    def full_step():
        full_optimizer.zero_grad(set_to_none=True)
        criterion(full(x), labels).backward()
        full_optimizer.step()

    repeat("CoLoR training step", color_step)
    repeat("full fine-tuning step", full_step)
    with torch.no_grad():
        repeat("frozen-backbone forward", lambda: model.features(x))
    memory = {"CoLoR": training_memory(color_step, model, color_optimizer, device),
              "full fine-tuning": training_memory(full_step, full, full_optimizer, device)}

    # peft's mixed-adapter batch on the same ViT shape and batch.
    peft_note = ""
    try:
        peft_model = peft_mixed_batch(copy.deepcopy(plain), args.experts, args.rank)
        names = [f"expert{int(e)}" for e in mixed]
        with torch.no_grad():
            repeat("peft mixed batch, 10 adapters", lambda: peft_model(x, adapter_names=names))
    except ImportError:
        peft_note = "peft is not installed (pip install -e '.[perf]'): R5 not measured."

    t = timings
    ratios = [
        ("R1", "CoLoR training step / frozen-backbone forward", t["CoLoR training step"] / t["frozen-backbone forward"], "about 2.0", "<= 2.3"),
        ("R2", "CoLoR training step / full fine-tuning step", t["CoLoR training step"] / t["full fine-tuning step"], "", ""),
        ("R2 memory", "CoLoR / full fine-tuning training memory", memory["CoLoR"] / memory["full fine-tuning"], "", "<= 0.6"),
        ("R3", "routed inference throughput / plain forward throughput", t["plain forward"] / t["routed inference, 10 experts mixed"], "0.5", ">= 0.45"),
        ("R4", "routed inference, 10 experts mixed / 1 expert (time)", t["routed inference, 10 experts mixed"] / t["routed inference, 1 expert"], "1.0", "<= 1.15"),
        ("R4 expert pass", "expert pass, 10 experts mixed / 1 expert (time)", t["expert pass, 10 experts mixed"] / t["expert pass, 1 expert"], "1.0", ""),
    ]
    if "peft mixed batch, 10 adapters" in t:
        ratios.append(("R5", "our expert pass / peft mixed-adapter batch, 10 experts (time)",
                       t["expert pass, 10 experts mixed"] / t["peft mixed batch, 10 adapters"], "", "<= 0.7"))
    ratios += [
        ("routing", "nearest prototype / plain forward (time)", t["routing (nearest prototype)"] / t["plain forward"], "", "< 0.01"),
        ("k-means", "k-means fit on 1000 samples / forward of 1000 samples", t["k-means fit (1000 samples)"] / (t["plain forward"] * 1000 / args.batch_size), "", "< 0.01"),
    ]

    machine = (torch.cuda.get_device_name(device) if device.type == "cuda"
               else f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads")
    command = "python -m benchmarks.perf " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("out",) and v != parser.get_default(k))
    lines = [f"`{command.strip()}`", "",
             f"{args.model} (random weights), batch {args.batch_size}, rank {args.rank}, {args.experts} experts, "
             f"k {args.k}, median of {args.repeats} after a warm-up; device {device.type} ({machine}); "
             f"torch {torch.__version__}", "",
             "| ratio | what | measured | ideal | target |", "|---|---|---|---|---|"]
    lines += [f"| {name} | {what} | {value:.3f} | {ideal} | {target} |" for name, what, value, ideal, target in ratios]
    lines += ["", "| timing | seconds |", "|---|---|"]
    lines += [f"| {name} | {seconds:.4f} |" for name, seconds in t.items()]
    lines += ["", "| training memory beyond weights | MiB |", "|---|---|"]
    lines += [f"| {name} | {size / 2**20:.1f} |" for name, size in memory.items()]
    memory_kind = ("CUDA allocator peak during a step" if device.type == "cuda"
                   else "CPU: tensors autograd saves for backward + gradients + optimiser state")
    lines += ["", f"Memory measured as: {memory_kind}."]
    if peft_note:
        lines += ["", peft_note]
    else:
        lines += ["", "peft adapts q, k and v of the fused qkv (it cannot leave k out of a fused layer); "
                  "our experts adapt q and v only, as the paper does."]
    report = "\n".join(lines)
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report + "\n")


if __name__ == "__main__":
    main()
