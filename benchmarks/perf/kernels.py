"""The two mixed-expert kernels side by side: time on this device, and operators per forward.

    python -m benchmarks.perf --only kernels --threads 1 --out /tmp/perf-kernels.md
    python -m benchmarks.perf.kernels          # only the operator counts, printed (seconds on a CPU)

``segments`` sorts a batch by expert and computes each expert on its run of samples; ``gathered``
gathers each sample's expert factors and head (:mod:`avalanche_color.experts.routed_vit`).
Operators are counted on the CPU with a ``TorchDispatchMode``: every ATen operator that computes
(views and other metadata-only operators left out). On a GPU each of them launches at least one
kernel, so their number per forward is the launch count, less what a fused attention or a cuBLAS
call may add; the counts do not depend on the image size, so a small image gives the same figures.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import timm
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from avalanche_color.experts.routed_vit import predict
from benchmarks.perf.timing import Variant, interleaved, machine, per_round
from benchmarks.perf.workloads import CLASSES, build_color

KERNELS = ("segments", "gathered")
# Operators that only make a new view or read metadata: no kernel on a GPU.
_NO_KERNEL = {"view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "slice", "select",
              "unsqueeze", "squeeze", "as_strided", "alias", "detach", "unbind", "split", "split_with_sizes",
              "chunk", "narrow", "lift_fresh", "empty", "empty_like", "empty_strided", "is_same_size",
              "_reshape_alias", "contiguous", "result_type", "sym_size", "sym_stride", "sym_numel", "dim",
              "size", "stride", "numel"}


class OperatorCounter(TorchDispatchMode):
    """Counts the ATen operators that compute, by name, while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in _NO_KERNEL:
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))


def count_operators(run: Callable[[], object]) -> Counter[str]:
    """The computing ATen operators ``run()`` calls, by name."""
    with torch.no_grad(), OperatorCounter() as counter:
        run()
    return counter.counts


def mix(batch: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` experts spread evenly over ``batch`` samples, in random order."""
    return (torch.arange(batch) % count)[torch.randperm(batch, generator=generator)]


def operator_counts(model_name: str, counts: Sequence[int], batch: int, rank: int, image_size: int = 32,
                    ) -> dict[tuple[str, int], int]:
    """Operators of one expert pass (``predict`` with every expert finished) per kernel and number of experts
    in the batch: ``result[kernel, experts]``. A random ``model_name`` ViT (its depth and widths) at
    ``image_size`` px, holding ``max(counts)`` experts."""
    vit = timm.create_model(model_name, pretrained=False, num_classes=0, img_size=image_size)
    model = build_color(vit, max(counts), rank, CLASSES, k=2, device=torch.device("cpu")).eval()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, image_size, image_size, generator=generator)
    model.bank.set_trainable(None)  # every expert finished, as in an evaluation after training
    num_classes = model.num_classes  # outside the count: a model keeps it as a Python int (issue 38, point 3)
    result = {}
    for count in counts:
        experts = mix(batch, count, generator)
        for kernel in KERNELS:
            def expert_pass(kernel=kernel, experts=experts):
                return predict(model.features, model.bank.heads, num_classes, x, experts, None, kernel)
            expert_pass()  # builds the gathered kernel's stacks, once, as on the first batch
            result[kernel, count] = sum(count_operators(expert_pass).values())
    return result


def operator_rows(model_name: str, counts: Sequence[int], batch: int, rank: int) -> list[str]:
    """A markdown table of :func:`operator_counts`."""
    found = operator_counts(model_name, counts, batch, rank)
    lines = [f"| experts in a batch of {batch} | " + " | ".join(f"{k} kernel" for k in KERNELS) + " |",
             "|---|" + "---|" * len(KERNELS)]
    lines += [f"| {n} | " + " | ".join(str(found[k, n]) for k in KERNELS) + " |" for n in counts]
    return lines


def kernel_section(args: argparse.Namespace, command: str, device: torch.device,
                   precision: Callable[[], AbstractContextManager]) -> str:
    """The ``## Mixed-expert kernels`` section: R3 and R4 per kernel, each kernel's expert pass against the
    plain forward for the ``--mixed-experts`` counts, and the operators per forward."""
    mixed_counts = [int(n) for n in args.mixed_experts.split(",") if n.strip()]  # '' for no overhead rows
    mixed_batch = args.mixed_batch_size or max([args.batch_size, *mixed_counts])
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    make_vit = lambda: timm.create_model(args.model, pretrained=False, num_classes=0)  # noqa: E731
    plain = make_vit().to(device).eval()
    size = plain.patch_embed.img_size
    model = build_color(make_vit(), max([args.experts, *mixed_counts]), args.rank, CLASSES, args.k, device).eval()
    model.bank.set_trainable(None)  # every expert finished, as in an evaluation after training
    x = torch.randn(args.batch_size, 3, *size, generator=generator).to(device)
    xm = torch.randn(mixed_batch, 3, *size, generator=generator).to(device)
    mixed = mix(args.batch_size, args.experts, generator).to(device)
    single = torch.zeros(args.batch_size, dtype=torch.long, device=device)
    mixes = {n: mix(mixed_batch, n, generator).to(device) for n in mixed_counts}

    def timed(kernel: str, run: Callable[[], object]) -> Variant:
        def call():
            model.mixed_kernel = kernel
            with torch.no_grad():
                run()
        return Variant(call)

    def routed(experts: torch.Tensor) -> Callable[[], object]:
        def run():
            model.router(model.routing_features(x))  # the routing pass as usual, a chosen mix of experts
            return model.predict(x, experts)
        return run

    variants = {"plain forward": timed("segments", lambda: plain(x))}
    if mixed_counts:
        variants[f"plain forward, batch {mixed_batch}"] = timed("segments", lambda: plain(xm))
    for kernel in KERNELS:
        variants[f"{kernel}: routed, {args.experts} mixed"] = timed(kernel, routed(mixed))
        variants[f"{kernel}: routed, 1 expert"] = timed(kernel, routed(single))
        for n, experts in mixes.items():
            variants[f"{kernel}: expert pass, {n} in batch {mixed_batch}"] = timed(
                kernel, lambda experts=experts: model.predict(xm, experts))
    rounds = interleaved(variants, args.rounds, device, precision)
    ratio = lambda f: per_round(rounds, f).format()  # noqa: E731
    e, m = args.experts, mixed_batch
    lines = ["## Mixed-expert kernels", "", f"`{command}`", "",
             f"{args.model} (random weights), batch {args.batch_size} (expert-pass rows: batch {m}), rank {args.rank}; "
             f"device {device.type} ({machine(device)}); {'bf16 autocast' if args.bf16 else 'float32'}; "
             f"torch {torch.__version__}; median (min-max) of {args.rounds} interleaved rounds", "",
             "| row | what | " + " | ".join(KERNELS) + " | target |", "|---|---|" + "---|" * len(KERNELS) + "---|",
             f"| R3 | routed inference throughput / plain forward throughput, {e} experts mixed | "
             + " | ".join(ratio(lambda t, k=k: t["plain forward"] / t[f"{k}: routed, {e} mixed"]) for k in KERNELS)
             + " | >= 0.45 |",
             f"| R4 | routed inference, {e} experts mixed / 1 expert (time) | "
             + " | ".join(ratio(lambda t, k=k: t[f"{k}: routed, {e} mixed"] / t[f"{k}: routed, 1 expert"])
                          for k in KERNELS) + " | <= 1.15 |"]
    for n in mixed_counts:
        lines.append(f"| overhead, {n} | (expert pass - plain forward) / plain forward, {n} experts in batch {m} | "
                     + " | ".join(ratio(lambda t, k=k, n=n: t[f"{k}: expert pass, {n} in batch {m}"]
                                        / t[f"plain forward, batch {m}"] - 1) for k in KERNELS) + " | |")
    lines += ["", "Operators per expert pass (`model.predict`), counted on the CPU (each launches at least one "
              "kernel on a GPU); same model, image size 32 px (the counts do not depend on it):", ""]
    lines += operator_rows(args.model, sorted({1, args.experts, *mixed_counts}), m, args.rank)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description="Operators per expert pass of the two mixed-expert kernels.")
    parser.add_argument("--model", default="vit_base_patch16_224")
    parser.add_argument("--experts", default="1,10,50", help="comma-separated numbers of experts in one batch")
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--rank", type=int, default=64)
    args = parser.parse_args()
    counts = [int(n) for n in args.experts.split(",") if n.strip()]
    print("\n".join(operator_rows(args.model, counts, max(args.batch_size, *counts), args.rank)))


if __name__ == "__main__":
    main()
