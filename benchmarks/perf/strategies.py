"""The methods as their users run them: each strategy built by its own constructor on a seeded ViT, grown by its
own ``train`` calls on a synthetic stream, and timed inside its own training and evaluation loops.

A :class:`Clock` is a plugin: it times each iteration of the strategy it is given to, from its
``before_*_iteration`` callback to its ``after_*_iteration`` (the strategy's forward, loss, backward and
optimiser step, its schedule and the plugins' iteration callbacks between them; the batch is already on the
device); :class:`~benchmarks.perf.memory.IterationMemory`, another plugin, measures an iteration's memory.
:class:`TrainingTurns` runs ``strategy.train(experience)`` in a thread that the clock holds between iterations,
so that one call of :meth:`TrainingTurns.step` is one iteration of the strategy's own training loop and
the iterations of several strategies (and any other timed call) interleave, round by round
(:func:`benchmarks.perf.timing.interleaved`). Evaluation needs no thread: ``strategy.eval`` of a one-batch
experience is one evaluation iteration (:func:`evaluation_variant`).

:func:`synthetic_stream` is the stream (random images, ``classes`` new classes per experience),
:func:`strategies` builds each method of the timing rows by name (:func:`memory_strategies` those of the memory
rows) and :func:`grown` trains a strategy on every experience but the last, the last being the one its training
turns learn. Evaluation between training iterations is what Avalanche's periodic evaluation does. Weights and images are random: timings do not depend
on them (a strategy may warn that an experience learned nothing: ``ExpertLearnedNothing``, which the callers
filter).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Callable, Optional, Sequence

import timm
import torch
from avalanche.benchmarks import tensors_benchmark
from avalanche.core import SupervisedPlugin
from avalanche.training import Naive
from avalanche.training.plugins import EvaluationPlugin
from torch import nn

from avalanche_color import L2P, CLLoRA, CoLoR, InfLoRA, LoRASubtraction, SDLoRA, SDLoRAConfig, SDLoRAViT, SPrompts
from avalanche_color.peers.lora_sum.model import Mixing
from benchmarks.perf.timing import Variant, synchronize


def quiet_evaluator() -> EvaluationPlugin:
    """No metric and no logger: what the strategies compute for their metrics is not timed, nothing is printed."""
    return EvaluationPlugin(loggers=[])


class Clock(SupervisedPlugin):
    """Times every training and evaluation iteration of its strategy (``training`` and ``evaluation``: seconds,
    in order). With ``turns``, the training loop waits after each iteration until :meth:`TrainingTurns.step`
    lets the next one run."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.turns: Optional[TrainingTurns] = None  # set by TrainingTurns
        self.training: list[float] = []
        self.evaluation: list[float] = []
        self._start = 0.0

    def _begin(self) -> None:
        synchronize(self.device)
        self._start = time.perf_counter()

    def _end(self) -> float:
        synchronize(self.device)
        return time.perf_counter() - self._start

    def before_training_iteration(self, strategy: Any, **kwargs: Any) -> None:
        self._begin()

    def after_training_iteration(self, strategy: Any, **kwargs: Any) -> None:
        self.training.append(self._end())
        if self.turns is not None:
            self.turns.wait_for_turn()

    def before_eval_iteration(self, strategy: Any, **kwargs: Any) -> None:
        self._begin()

    def after_eval_iteration(self, strategy: Any, **kwargs: Any) -> None:
        self.evaluation.append(self._end())


class TrainingTurns:
    """``strategy.train(experience)`` in a thread of its own, one training iteration per :meth:`step`.

    :meth:`start` runs the call through its first iteration (the experience's adaptation: a new expert,
    InfLoRA's design of ``A_t``, ...; then one iteration, untimed), :meth:`step` runs one more iteration and
    returns its seconds (the :class:`Clock`'s), :meth:`close` lets the call finish (what follows training:
    prototypes, subspaces) and waits for it. Nothing of the strategy runs while its turn is not on, so the
    thread never runs beside other timed work. The experience must hold one batch more than there are steps.
    ``context`` is entered in the thread around the call (autocast, for a strategy that has no ``precision``
    option: it is per thread).

    The thread waits where Avalanche's periodic evaluation (``eval_every`` by iterations) runs, at the end of an
    iteration, so ``strategy.eval`` may run between steps: it sees the experiences learned before and the one
    being learned as it stands.
    """

    def __init__(self, strategy: Any, experience: Any, clock: Clock,
                 context: Callable[[], AbstractContextManager] = nullcontext) -> None:
        self.strategy, self.experience, self.clock, self.context = strategy, experience, clock, context
        clock.turns = self
        self._go, self._done = threading.Event(), threading.Event()
        self._error: Optional[BaseException] = None
        self._finished = False
        self._thread = threading.Thread(target=self._train, daemon=True)

    def _train(self) -> None:
        try:
            with self.context():
                self.strategy.train(self.experience)
        except BaseException as error:  # handed to the caller's thread by _wait
            self._error = error
        finally:
            self._finished = True
            self._done.set()

    def wait_for_turn(self) -> None:
        """Called by the clock in the strategy's thread: hand the turn back, wait for the next."""
        self._done.set()
        self._go.wait()
        self._go.clear()

    def _wait(self) -> None:
        self._done.wait()
        self._done.clear()
        if self._error is not None:
            raise RuntimeError(f"{type(self.strategy).__name__}'s training failed") from self._error

    def start(self) -> TrainingTurns:
        self._thread.start()
        self._wait()
        if self._finished:
            raise RuntimeError(f"{type(self.strategy).__name__}'s experience has one batch: give it one more "
                               "than the steps")
        return self

    def step(self) -> float:
        """One iteration of the strategy's training loop; its seconds."""
        if self._finished:
            raise RuntimeError(f"{type(self.strategy).__name__}'s experience has no batch left: give it one "
                               "more than the steps")
        count = len(self.clock.training)
        self._go.set()
        self._wait()
        if len(self.clock.training) != count + 1:
            raise RuntimeError(f"{type(self.strategy).__name__}'s experience had no batch left: give it one "
                               "more than the steps")
        return self.clock.training[-1]

    def close(self) -> None:
        """Let the training call run to its end (the rest of its experience untimed) and wait for it."""
        while not self._finished:
            self._go.set()
            self._wait()
        self._thread.join()


def training_variant(turns: TrainingTurns) -> Variant:
    """One iteration of the strategy's own training loop, timed by its clock."""
    return Variant(turns.step, clock=lambda: turns.clock.training[-1], autocast=False)


def evaluation_variant(strategy: Any, experience: Any, clock: Clock) -> Variant:
    """``strategy.eval`` of a one-batch experience: one iteration of the strategy's evaluation loop, timed by its
    clock (the loader and the call's callbacks around the iteration left out)."""
    return Variant(lambda: strategy.eval([experience]), clock=lambda: clock.evaluation[-1], autocast=False)


def synthetic_stream(experiences: int, classes: int, image_size: tuple[int, ...], train_samples: list[int],
                     test_samples: int, seed: int = 0) -> Any:
    """An Avalanche class-incremental stream of random images: experience ``e`` holds classes
    ``e * classes ... (e + 1) * classes - 1``, ``train_samples[e]`` training and ``test_samples`` test images
    (labels cycling over its classes)."""
    generator = torch.Generator().manual_seed(seed)

    def split(experience: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        images = torch.randn(count, 3, *image_size, generator=generator)
        return images, torch.arange(count) % classes + experience * classes

    train = [split(e, train_samples[e]) for e in range(experiences)]
    test = [split(e, test_samples) for e in range(experiences)]
    return tensors_benchmark(train, test, task_labels=[0] * experiences)


def grown(strategy: Any, stream: Any) -> Any:
    """``strategy`` trained on every experience of ``stream`` but the last."""
    for experience in list(stream.train_stream)[:-1]:
        strategy.train(experience)
    return strategy


# The strategies of the timing rows, by name; the memory rows add S-Prompts, L2P and SD-LoRA unfolded.
RANKED = {"CoLoR": CoLoR, "SD-LoRA": SDLoRA, "InfLoRA": InfLoRA, "LoRA-Sub": LoRASubtraction, "CL-LoRA": CLLoRA}
Plugins = Callable[[str], Sequence[SupervisedPlugin]]


class UnfoldedSDLoRAViT(SDLoRAViT):
    """SD-LoRA with every direction computed low-rank over the tokens, none folded into the weight: the
    same outputs, and what keeping each earlier direction in the training graph per sample costs (a
    comparison for the memory rows, not a method of the package)."""

    def mixing(self) -> Mixing:
        return dataclasses.replace(super().mixing(), low_rank=frozenset(range(self.num_experts)))


def strategies(make_vit: Callable[[], nn.Module], rank: int, k: int, batch: int, device: torch.device,
               precision: str, total_classes: int, plugins: Plugins) -> dict[str, Callable[[], Any]]:
    """A fresh strategy of each method of the timing rows by name, with ``plugins(name)``: CoLoR (``k``
    prototypes), SD-LoRA, InfLoRA, LoRA subtraction and CL-LoRA at ``rank``, their other options their
    defaults, one epoch per experience, batches of ``batch``; and full fine-tuning, Avalanche's ``Naive`` on the
    same ViT with a head over ``total_classes`` and SGD with momentum 0.9 at lr 1e-3 (no ``precision``: its
    caller runs it under autocast)."""
    common = common_options(batch, device, precision)

    def method(name: str) -> Callable[[], Any]:
        def build() -> Any:
            options = dict(common, k=k) if name == "CoLoR" else common
            return RANKED[name](make_vit(), rank=rank, plugins=list(plugins(name)), **options)
        return build

    def full_fine_tuning() -> Any:
        vit = make_vit()
        vit.reset_classifier(total_classes)
        return Naive(model=vit, optimizer=torch.optim.SGD(vit.parameters(), lr=1e-3, momentum=0.9),
                     criterion=nn.CrossEntropyLoss(), train_epochs=1, train_mb_size=batch, eval_mb_size=batch,
                     device=device, plugins=list(plugins("full fine-tuning")), evaluator=quiet_evaluator)

    return {**{name: method(name) for name in RANKED}, "full fine-tuning": full_fine_tuning}


def memory_strategies(make_vit: Callable[[], nn.Module], rank: int, k: int, batch: int, device: torch.device,
                      precision: str, plugins: Plugins) -> dict[str, Callable[[], Any]]:
    """A fresh strategy of each method of the memory rows by name, with ``plugins(name)``: CoLoR and S-Prompts
    (``k`` prototypes; S-Prompts' 10 prompt tokens per expert), L2P (a pool of 10 prompts of 5 tokens, 5 chosen
    per sample), SD-LoRA, InfLoRA, LoRA subtraction and CL-LoRA at ``rank``, and SD-LoRA unfolded
    (:class:`UnfoldedSDLoRAViT`), each with its defaults otherwise, one epoch per experience."""
    common = common_options(batch, device, precision)

    def build(name: str, make: Callable[[list], Any]) -> Callable[[], Any]:
        return lambda: make(list(plugins(name)))

    return {
        "CoLoR": build("CoLoR", lambda p: CoLoR(make_vit(), rank=rank, k=k, plugins=p, **common)),
        "S-Prompts": build("S-Prompts", lambda p: SPrompts(make_vit(), k=k, plugins=p, **common)),
        "L2P": build("L2P", lambda p: L2P(make_vit(), plugins=p, **common)),
        "SD-LoRA": build("SD-LoRA", lambda p: SDLoRA(make_vit(), rank=rank, plugins=p, **common)),
        "SD-LoRA, unfolded": build("SD-LoRA, unfolded", lambda p: SDLoRA(
            UnfoldedSDLoRAViT(make_vit(), SDLoRAConfig(rank=rank)), plugins=p, **common)),
        "InfLoRA": build("InfLoRA", lambda p: InfLoRA(make_vit(), rank=rank, plugins=p, **common)),
        "LoRA-Sub": build("LoRA-Sub", lambda p: LoRASubtraction(make_vit(), rank=rank, plugins=p, **common)),
        "CL-LoRA": build("CL-LoRA", lambda p: CLLoRA(make_vit(), rank=rank, plugins=p, **common)),
    }


def common_options(batch: int, device: torch.device, precision: str) -> dict[str, Any]:
    """What every package strategy takes here: one epoch per experience, batches of ``batch``, no metric."""
    return dict(train_epochs=1, train_mb_size=batch, eval_mb_size=batch, device=device, precision=precision,
                evaluator=quiet_evaluator)


def timm_vit(name: str) -> Callable[[], nn.Module]:
    """A maker of the same seeded timm ViT (random weights, no head) for every strategy."""
    def make() -> nn.Module:
        torch.manual_seed(0)
        return timm.create_model(name, pretrained=False, num_classes=0)
    return make
