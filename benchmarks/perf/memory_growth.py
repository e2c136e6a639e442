"""Training memory and stored state of every method against the number of experiences learned.

For each method one model grows experience by experience (:mod:`benchmarks.perf.learners`); at each
count t asked for, one training step of experience t (t - 1 learned before) is measured
(:func:`benchmarks.perf.memory.step_memory`), with the bytes of the learned state held meanwhile, and
the state stored once experience t is over.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from benchmarks.perf.learner import Learner
from benchmarks.perf.memory import StepMemory, state_bytes, step_memory

HEADING = "## Training memory against experiences learned"


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
