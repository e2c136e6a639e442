"""The ratio rows of ``python -m benchmarks.perf``'s table (R1 to R5, routing, routers, loader), each computed
within a round from that round's timings."""

from __future__ import annotations

import argparse
from functools import partial

from benchmarks.perf.report import plural
from benchmarks.perf.sizes import CLASS_ROUTERS, CLASSES, PHOTOS
from benchmarks.perf.timing import Spread, per_round
from benchmarks.perf.workloads import PHOTO_SIZE, JPEGDataset


def ratio_rows(rounds: list[dict[str, float]], args: argparse.Namespace, memory: dict[str, int], e: int, m: int,
               mixed_counts: list[int], peft_note: str, loader_workers: list[int], photos: JPEGDataset,
               size: tuple[int, ...]) -> list[tuple]:
    """The rows (name, what, value, ideal, target), ``e`` experts mixed, batch ``m`` in the R5 rows."""
    routed_mixed, expert_mixed = f"routed inference, {e} experts mixed", f"expert pass, {e} experts mixed"
    ratio = partial(per_round, rounds)
    rows = [
        ("R1", "CoLoR training step / frozen-backbone forward",
         ratio(lambda t: t["CoLoR training step"] / t["frozen-backbone forward"]), "about 2.0", "<= 2.3"),
        ("R2", "CoLoR training step / full fine-tuning step",
         ratio(lambda t: t["CoLoR training step"] / t["full fine-tuning step"]), "", ""),
        ("R2 memory", "CoLoR / full fine-tuning training memory (one measurement)",
         Spread([memory["CoLoR"] / memory["full fine-tuning"]]), "", "<= 0.6"),
        ("R3", f"routed inference throughput / plain forward throughput, {e} experts mixed",
         ratio(lambda t: t["plain forward"] / t[routed_mixed]), "0.5", ">= 0.45"),
        ("R4", f"routed inference, {e} experts mixed / 1 expert (time)",
         ratio(lambda t: t[routed_mixed] / t["routed inference, 1 expert"]), "1.0", "<= 1.15"),
        ("R4 expert pass", f"expert pass, {e} experts mixed / 1 expert (time)",
         ratio(lambda t: t[expert_mixed] / t["expert pass, 1 expert"]), "1.0", ""),
    ]
    # One forward and no router against CoLoR's two passes, LoRA-Sub's nearest mean included; CL-LoRA runs its
    # shared blocks once and its task-specific ones (half the blocks) once per experience learned.
    cl_lora_passes = (1 + e) / 2
    inference_ideal = {"SD-LoRA": "about 2", "InfLoRA": "about 2", "LoRA-Sub": "about 2",
                       "CL-LoRA": f"about {2 / cl_lora_passes:.2f}"}
    for name, ideal in inference_ideal.items():
        rows += [
            (f"{name} step", f"{name} training step / frozen-backbone forward ({e} experiences learned)",
             ratio(lambda t, name=name: t[f"{name} training step"] / t["frozen-backbone forward"]), "", ""),
            (f"{name} inference", f"{name} inference throughput / CoLoR routed inference throughput, {e} experts mixed",
             ratio(lambda t, name=name: t[routed_mixed] / t[f"{name} inference"]), ideal, ""),
        ]
    if mixed_counts and not peft_note:
        ours = lambda n: f"expert pass, {n} {plural(n)} in batch {m}"  # noqa: E731
        peft = lambda n: f"peft mixed-adapter pass, {n} {plural(n, 'adapter')} in batch {m}"  # noqa: E731
        plain_m = f"plain forward, batch {m}"
        if e in mixed_counts:
            rows.append(("R5", f"our expert pass / peft mixed-adapter pass, {e} experts in batch {m} (time)",
                         ratio(lambda t: t[ours(e)] / t[peft(e)]), "", ""))
        for n in mixed_counts:
            rows.append((f"R5 overhead, {n} {plural(n)}",
                         f"(our expert pass - plain forward) / (peft's - plain forward), {n} in batch {m}",
                         ratio(lambda t, n=n: (t[ours(n)] - t[plain_m]) / (t[peft(n)] - t[plain_m])), "", "<= 1.0"))
    rows += [
        ("routing", "nearest prototype / plain forward (time)",
         ratio(lambda t: t["routing (nearest prototype)"] / t["plain forward"]), "", "< 0.01"),
        ("k-means", "k-means fit on 1000 samples / forward of 1000 samples",
         ratio(lambda t: t["k-means fit (1000 samples)"] / (t["plain forward"] * 1000 / args.batch_size)), "", "< 0.01"),
    ]
    for kind in CLASS_ROUTERS:
        rows += [
            (f"{kind} router", f"{kind} router ({args.experts} experts x {CLASSES} classes) / plain forward (time)",
             ratio(lambda t, kind=kind: t[f"routing ({kind} router)"] / t["plain forward"]), "", "< 0.02"),
            (f"{kind} router fit", f"{kind} router fit on 1000 samples / forward of 1000 samples",
             ratio(lambda t, kind=kind: t[f"{kind} router fit (1000 samples)"] / (t["plain forward"] * 1000 / args.batch_size)),
             "", "< 0.02"),
        ]

    step_rate = lambda t: args.batch_size / t["CoLoR training step"]  # noqa: E731
    for workers in loader_workers:
        loader_rate = lambda t, w=workers: len(photos) / t[f"loader epoch, {w} {plural(w, 'worker')}"]  # noqa: E731
        rows += [
            (f"loader, {workers} {plural(workers, 'worker')}",
             f"loader images/s: {PHOTOS} JPEG photos {PHOTO_SIZE[0]}x{PHOTO_SIZE[1]} decoded, RandomResizedCrop("
             f"{size[0]}), flip, normalise, batch {args.batch_size}", ratio(loader_rate), "", ""),
            (f"loader / step, {workers} {plural(workers, 'worker')}",
             "loader images/s / CoLoR training step images/s", ratio(lambda t, r=loader_rate: r(t) / step_rate(t)),
             "", ">= 1"),
        ]
    if loader_workers:
        rows.append(("training step", f"CoLoR training step images/s, batch {args.batch_size}",
                     ratio(step_rate), "", ""))
    return rows
