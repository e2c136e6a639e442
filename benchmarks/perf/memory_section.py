"""The memory-growth section of ``python -m benchmarks.perf`` on ``--memory-model``, measured and written."""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import AbstractContextManager
from typing import Callable

import timm
import torch
from torch import nn

from benchmarks.perf.learners import learners, settings
from benchmarks.perf.memory_growth import measure_growth, section
from benchmarks.perf.report import command_line, machine
from benchmarks.perf.sizes import CLASSES


def memory_rows(parser: argparse.ArgumentParser, args: argparse.Namespace, counts: list[int],
                device: torch.device, precision: Callable[[], AbstractContextManager]) -> str:
    """The memory-growth section on ``--memory-model``: every method through ``max(counts)`` experiences."""
    def make_vit() -> nn.Module:
        torch.manual_seed(0)  # every method on the same backbone, whichever methods ran before
        return timm.create_model(args.memory_model, pretrained=False, num_classes=0)

    vit = make_vit()
    x = torch.randn(args.batch_size, 3, *vit.patch_embed.img_size, generator=torch.Generator().manual_seed(0))
    measurements = []
    for name, make_learner in learners(make_vit, args.rank, args.k, CLASSES, device).items():
        start = time.perf_counter()
        measurements += measure_growth(make_learner(), counts, x.to(device), device, precision)
        print(f"[perf] memory rows: {name}, {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    setting = (f"{args.memory_model} (random weights), batch {args.batch_size}, {CLASSES} new classes per experience; "
               f"{settings(args.rank, args.k)}; device {device.type} ({machine(device)}); "
               f"{'bf16 autocast' if args.bf16 else 'float32'}; torch {torch.__version__}")
    weights = sum(t.nbytes for t in vit.state_dict().values())
    return "\n".join(section(measurements, command_line(parser, args), setting, device, weights))
