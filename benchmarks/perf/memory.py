"""Training memory: what one training step holds beyond the weights, the bytes of a learned state, and the
memory-growth section of ``python -m benchmarks.perf`` (``--only memory``), measured and written.

For each method its strategy (:func:`benchmarks.perf.strategies.memory_strategies`) learns one experience after
another of a synthetic stream by its own ``train``; at each count t asked for, the first iteration of its
training on experience t (t - 1 learned before) is measured by a plugin (:class:`IterationMemory`), with the
bytes of the learned state held meanwhile, and the state stored once experience t is over.
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
from avalanche.core import SupervisedPlugin
from torch import Tensor, nn

from avalanche_color import L2PModelOptions, PromptOptions
from benchmarks.perf.strategies import memory_strategies, synthetic_stream, timm_vit
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


class MemoryProbe:
    """What one training step holds beyond ``model``'s weights, measured from :meth:`start` to :meth:`stop`
    (:class:`StepMemory`); started and stopped in the thread that runs the step (autograd's hooks are per
    thread)."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.model, self.device = model, device
        self.saved: dict[int, int] = {}
        self._before = 0
        self._hooks: Optional[AbstractContextManager] = None

    def _pack(self, tensor: Tensor) -> Tensor:
        storage = tensor.untyped_storage()
        self.saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._before = torch.cuda.memory_allocated(self.device)
            return
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor)
        self._hooks.__enter__()

    def stop(self, optimizer: torch.optim.Optimizer) -> StepMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return StepMemory(torch.cuda.max_memory_allocated(self.device) - self._before)
        if self._hooks is not None:
            self._hooks.__exit__(None, None, None)
        # A parameter saved for backward (a frozen weight, an expert's A) costs nothing more: it is a weight.
        parameters = {p.untyped_storage().data_ptr() for p in self.model.parameters()}
        activations = sum(size for ptr, size in self.saved.items() if ptr not in parameters)
        gradients = sum(p.grad.nbytes for p in self.model.parameters() if p.grad is not None)
        state = sum(t.nbytes for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))
        return StepMemory(activations + gradients + state, activations, gradients, state)


class IterationMemory(SupervisedPlugin):
    """Measures the next training iteration of its strategy once asked (:meth:`measure_next`): what the
    iteration holds beyond the weights (:attr:`step`) and the bytes of the learned state meanwhile (:attr:`held`)."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.step: Optional[StepMemory] = None
        self.held = 0
        self._asked = False
        self._probe: Optional[MemoryProbe] = None

    def measure_next(self) -> None:
        self._asked, self.step = True, None

    def before_training_iteration(self, strategy: Any, **kwargs: Any) -> None:
        if self._asked:
            self._probe = MemoryProbe(strategy.model, self.device)
            self._probe.start()

    def after_training_iteration(self, strategy: Any, **kwargs: Any) -> None:
        if self._probe is not None:
            self.step, self._probe, self._asked = self._probe.stop(strategy.optimizer), None, False
            self.held = state_bytes(learned_state(strategy.model))


def learned_state(model: nn.Module) -> dict[str, Tensor]:
    """Everything learned, no backbone weight: what a checkpoint keeps (``experts_state_dict()``; L2P, which has
    none, its ``state_dict()`` without the frozen backbone)."""
    if hasattr(model, "experts_state_dict"):
        return model.experts_state_dict()
    return {k: v for k, v in model.state_dict().items() if not k.startswith("backbone.")}


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


def measure_growth(strategy: Any, memory: IterationMemory, method: str, counts: Sequence[int],
                   stream: Any) -> list[Measurement]:
    """``strategy`` (with ``memory`` among its plugins) trained on the first ``max(counts)`` experiences of
    ``stream``, measured at each of ``counts``: the first iteration of experience t (its optimiser fresh, as
    the strategy makes one per experience), the state held then, the state stored after."""
    results = []
    for t, experience in enumerate(list(stream.train_stream)[: max(counts)], start=1):
        if t in counts:
            memory.measure_next()
        strategy.train(experience)
        if t in counts:
            if memory.step is None:
                raise RuntimeError(f"{method} trained experience {t} without an iteration")
            results.append(Measurement(method, t, memory.step, memory.held,
                                       state_bytes(learned_state(strategy.model))))
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
    step = ("the CUDA allocator's peak during the iteration" if device.type == "cuda" else
            "the tensors autograd saves for backward (each storage once, parameters not counted) + every gradient "
            "the model holds after it (those the strategy left on finished components included) + optimiser state")
    return [HEADING, "", f"`{command}`", "", setting, "",
            "Training memory at experience t (t - 1 learned before) = the learned state held (every expert, "
            "component, prompt, head and prototype, InfLoRA's protected subspaces, LoRA-Sub's projections (one d x d "
            "float64 matrix per block, from experience 2 until the experience ends), CL-LoRA's teacher: "
            "`experts_state_dict()`, L2P's `state_dict()` without the backbone) + what the first iteration of the "
            "strategy's own training on experience t adds: " + step + ". Each strategy trains as a user runs it "
            "(its `train`): its optimiser (SGD with momentum for CoLoR, S-Prompts, SD-LoRA and CL-LoRA, Adam for L2P "
            "and InfLoRA, LoRA-Sub's projected Adam), its loss and, for CL-LoRA from experience 2 on, the teacher's "
            "forward (no gradient), two gradients of the same graph (the distillation's and the loss's) and two SGD "
            "steps" + ("" if device.type == "cuda" else
            " (counted: the gradients left after the step, one set; the distillation's set is held during "
            "step 1 as well)") + ". "
            f"The frozen backbone's weights ({mib(backbone_bytes)} MiB) are in every method's memory and not "
            "counted. Stored state: the learned state once experience t is over. SD-LoRA, unfolded: the same "
            "model with every direction computed low-rank over the tokens, none folded into the weight (the same "
            "outputs), so that each earlier direction costs memory per sample, as in the growth users report for "
            "SD-LoRA's own code (WuYichen-97/SD-Lora-CL issue 11); a comparison, not a method of this package.", "",
            *table(measurements), "", *breakdown(measurements)]


def settings(rank: int, k: int) -> str:
    """What :func:`~benchmarks.perf.strategies.memory_strategies` builds, in words."""
    prompts, pool = PromptOptions(), L2PModelOptions()
    return (f"CoLoR, SD-LoRA, InfLoRA, LoRA-Sub and CL-LoRA rank {rank} (LoRA-Sub and CL-LoRA otherwise their "
            "codes' defaults: LoRA-Sub's threshold 0.99, CL-LoRA's shared adapters on the first half of the blocks); "
            f"S-Prompts {prompts.prompt_length} prompt tokens per expert; "
            f"L2P a pool of {pool.pool_size} prompts of {pool.prompt_length} tokens, {pool.top_n} chosen per sample; "
            f"k {k} prototypes per expert (CoLoR, S-Prompts); every strategy's own training, one epoch per "
            f"experience of max(batch, k) random images")


def memory_rows(args: argparse.Namespace, command: str, counts: list[int], device: torch.device) -> str:
    """The memory-growth section on ``--memory-model``: every method through ``max(counts)`` experiences;
    ``command`` is the command line it reports."""
    make_vit = timm_vit(args.memory_model)  # every method on the same backbone
    vit = make_vit()
    stream = synthetic_stream(max(counts), CLASSES, tuple(vit.patch_embed.img_size),
                              [max(args.batch_size, args.k)] * max(counts), args.batch_size)
    probes: dict[str, IterationMemory] = {}

    def plugins(name: str) -> list[SupervisedPlugin]:
        probes[name] = IterationMemory(device)
        return [probes[name]]

    precision_name = "bf16-mixed" if args.bf16 else "32-true"
    measurements = []
    for name, make in memory_strategies(make_vit, args.rank, args.k, args.batch_size, device, precision_name,
                                        plugins).items():
        start = time.perf_counter()
        measurements += measure_growth(make(), probes[name], name, counts, stream)
        print(f"[perf] memory rows: {name}, {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    setting = (f"{args.memory_model} (random weights), batch {args.batch_size}, {CLASSES} new classes per experience; "
               f"{settings(args.rank, args.k)}; device {device.type} ({machine(device)}); "
               f"{'bf16 autocast' if args.bf16 else 'float32'}; torch {torch.__version__}")
    weights = sum(t.nbytes for t in vit.state_dict().values())
    return "\n".join(section(measurements, command, setting, device, weights))
