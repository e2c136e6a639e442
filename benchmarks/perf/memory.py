"""Training memory: what one training step holds beyond the weights, the bytes of a learned state, and the
memory-growth section of ``python -m benchmarks.perf`` (``--only memory``), measured and written.

For each method one model grows experience by experience (:mod:`benchmarks.perf.learners`); at each
count t asked for, one training step of experience t (t - 1 learned before) is measured
(:func:`step_memory`), with the bytes of the learned state held meanwhile, and the state stored once
experience t is over.
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import timm
import torch
from torch import Tensor, nn

from benchmarks.perf.learners import Learner, learners, settings
from benchmarks.perf.timing import machine
from benchmarks.perf.workloads import CLASSES

HEADING = "## Training memory against experiences learned"


@dataclass(frozen=True)
class StepMemory:
    """Bytes one training step holds beyond the weights.

    On CPU, its parts: ``saved`` (what autograd saves for the backward pass, each storage once, the
    parameters' own storages left out), ``gradients`` and ``optimiser`` state. On CUDA only the total
    is known (the allocator's peak during the step minus what was allocated before); the parts are None.
    """

    total: int
    saved: Optional[int] = None
    gradients: Optional[int] = None
    optimiser: Optional[int] = None


def step_memory(step: Callable[[], object], model: nn.Module, optimizer: torch.optim.Optimizer,
                device: torch.device) -> StepMemory:
    """What ``step`` (zero_grad, forward, backward, optimiser step) holds beyond ``model``'s weights."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        torch.cuda.synchronize(device)
        return StepMemory(torch.cuda.max_memory_allocated(device) - before)
    saved: dict[int, int] = {}

    def pack(tensor: Tensor) -> Tensor:
        storage = tensor.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    # A parameter saved for backward (a frozen weight, an expert's A) costs nothing more: it is a weight.
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        step()
    activations = sum(size for ptr, size in saved.items() if ptr not in parameters)
    gradients = sum(p.grad.nbytes for p in model.parameters() if p.grad is not None)
    state = sum(t.nbytes for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))
    return StepMemory(activations + gradients + state, activations, gradients, state)


def training_memory(step: Callable[[], object], model: nn.Module, optimizer: torch.optim.Optimizer,
                    device: torch.device) -> int:
    """Bytes a training step holds beyond the weights (:func:`step_memory`'s total)."""
    return step_memory(step, model, optimizer, device).total


def state_bytes(state: dict[str, Tensor]) -> int:
    """Bytes of a state dict's tensors, as saved (each tensor in full)."""
    return sum(t.nbytes for t in state.values())


@dataclass(frozen=True)
class Measurement:
    """One method at experience t: its step, the learned state held while it trains, the state stored after."""

    method: str
    experiences: int
    step: StepMemory
    held: int
    stored: int

    @property
    def training(self) -> int:
        """What training experience t needs beyond the frozen backbone: the learned state and the step."""
        return self.held + self.step.total


def one_step(learner: Learner, x: Tensor, labels: Tensor, device: torch.device,
             precision: Callable[[], AbstractContextManager]) -> StepMemory:
    """The memory of one training step with a fresh optimiser, as each experience's first step."""
    model = learner.model.train()
    model.zero_grad(set_to_none=True)  # only this step's gradients count
    optimizer = learner.optimizer()

    with precision():
        memory = step_memory(lambda: learner.step(optimizer, x, labels), model, optimizer, device)
    model.zero_grad(set_to_none=True)
    return memory


def measure_growth(learner: Learner, counts: Sequence[int], x: Tensor, device: torch.device,
                   precision: Callable[[], AbstractContextManager]) -> list[Measurement]:
    """``learner`` through ``max(counts)`` experiences, measured at each of ``counts``."""
    generator = torch.Generator().manual_seed(0)
    results = []
    for experience in range(max(counts)):
        learner.start(experience)
        t = experience + 1
        if t in counts:
            labels = learner.labels(experience, x.shape[0], generator).to(device)
            step, held = one_step(learner, x, labels, device, precision), state_bytes(learner.learned_state())
        learner.finish(experience)
        if t in counts:
            results.append(Measurement(learner.name, t, step, held, state_bytes(learner.learned_state())))
    return results


def mib(size: Optional[int]) -> str:
    return "-" if size is None else f"{size / 2**20:.2f}"


def table(measurements: list[Measurement]) -> list[str]:
    """The side-by-side table: training memory and stored state at each count, per method; the stored
    state each further experience adds, from the first count to the last."""
    counts = sorted({m.experiences for m in measurements})
    at = {(m.method, m.experiences): m for m in measurements}
    first, last = counts[0], counts[-1]
    slash = " / ".join(str(c) for c in counts)
    lines = [f"| method | training memory, MiB, t = {slash} | t = {last} / t = {first} | stored state, MiB, "
             f"after {slash} | stored per further experience, KiB |", "|---|---|---|---|---|"]
    for method in dict.fromkeys(m.method for m in measurements):
        rows = [at[method, c] for c in counts]
        per = (rows[-1].stored - rows[0].stored) / max(last - first, 1) / 2**10
        lines.append(f"| {method} | {' / '.join(mib(r.training) for r in rows)} | "
                     f"{rows[-1].training / rows[0].training:.2f} | {' / '.join(mib(r.stored) for r in rows)} | "
                     f"{per:.1f} |")
    return lines


def breakdown(measurements: list[Measurement]) -> list[str]:
    """Where each figure comes from: the step's parts and the learned state."""
    lines = ["| method | t | saved for backward | gradients | optimiser state | learned state held | "
             "training memory | stored after t |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {m.method} | {m.experiences} | {mib(m.step.saved)} | {mib(m.step.gradients)} | "
              f"{mib(m.step.optimiser)} | {mib(m.held)} | {mib(m.training)} | {mib(m.stored)} |"
              for m in measurements]
    return lines


def section(measurements: list[Measurement], command: str, setting: str, device: torch.device,
            backbone_bytes: int) -> list[str]:
    """The markdown section: its heading, the command, the setting, what is counted, both tables."""
    step = ("the CUDA allocator's peak during the step" if device.type == "cuda" else
            "the tensors autograd saves for backward (each storage once, parameters not counted) + gradients + "
            "optimiser state")
    return [HEADING, "", f"`{command}`", "", setting, "",
            "Training memory at experience t (t - 1 learned before) = the learned state held (every expert, "
            "component, prompt, head and prototype, InfLoRA's protected subspaces, LoRA-Sub's projections (one d x d "
            "float64 matrix per block, from experience 2 until the experience ends), CL-LoRA's teacher: "
            "`experts_state_dict()`, L2P's `state_dict()` without the backbone) + what one training step adds: "
            + step + ". Each method's optimiser as its strategy builds it: SGD with momentum for CoLoR, S-Prompts, "
            "SD-LoRA and CL-LoRA, Adam for L2P and InfLoRA, LoRA-Sub's projected Adam. CL-LoRA's step from "
            "experience 2 on is its strategy's: the teacher's forward (no gradient), two gradients of the same graph "
            "(the distillation's and the loss's) and two SGD steps" + ("" if device.type == "cuda" else
            " (counted: the gradients left after the step, one set; the distillation's set is held during "
            "step 1 as well)") + ". "
            f"The frozen backbone's weights ({mib(backbone_bytes)} MiB) are in every method's memory and not "
            "counted. Stored state: the learned state once experience t is over. SD-LoRA, unfolded: the same "
            "model with every direction computed low-rank over the tokens, none folded into the weight (the same "
            "outputs), so that each earlier direction costs memory per sample, as in the growth users report for "
            "SD-LoRA's own code (WuYichen-97/SD-Lora-CL issue 11); a comparison, not a method of this package.", "",
            *table(measurements), "", *breakdown(measurements)]


def memory_rows(args: argparse.Namespace, command: str, counts: list[int], device: torch.device,
                precision: Callable[[], AbstractContextManager]) -> str:
    """The memory-growth section on ``--memory-model``: every method through ``max(counts)`` experiences;
    ``command`` is the command line it reports."""
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
    return "\n".join(section(measurements, command, setting, device, weights))
