"""The package functions one evaluation batch passes through, from the strategy's forward to the logits,
or one training step, from the strategy's training epoch to the optimiser's step.

    python -m benchmarks.investigations.forward_walk [--method CoLoR] [--router prototypes] [--training-step]

Trains a tiny ViT (random weights, 16 px synthetic images, three experiences) for one epoch per
experience, then traces ``strategy.forward()`` on a test batch with :func:`sys.setprofile`:
every first call of a function defined in the package, in call order. It prints two walks,
one batch whose samples route to several experts and one batch routed to one expert (the
frozen-expert kernels differ), and a count without properties, dunders and comprehensions, and
of the package files entered. With ``--training-step``, it traces instead the training epoch of
the third experience, which is one step (16 samples, batches of 16): the forward, the loss, the
plugins' callbacks, the backward and the optimiser's and schedule's step.
A design measure for reviews of the model's structure, not a test: the numbers say how many
functions a reader follows to understand a prediction or a training step.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from types import FrameType
from typing import Any, Callable

import torch
from avalanche.benchmarks import tensors_benchmark
from avalanche.training.plugins import EvaluationPlugin
from timm.models.vision_transformer import VisionTransformer

import avalanche_color
from avalanche_color import CoLoR, SPrompts

PACKAGE = Path(avalanche_color.__file__).parent
METHODS = {"CoLoR": CoLoR, "S-Prompts": SPrompts}
CLASSES_PER_EXPERIENCE, EXPERIENCES, SAMPLES_PER_CLASS = 2, 3, 8


def tiny_stream(seed: int = 0) -> Any:
    """Three class-incremental experiences of noisy copies of one 16 px template per class."""
    generator = torch.Generator().manual_seed(seed)
    classes = CLASSES_PER_EXPERIENCE * EXPERIENCES
    templates = torch.randn(classes, 3, 16, 16, generator=generator)

    def experience(first_class: int) -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.arange(first_class, first_class + CLASSES_PER_EXPERIENCE).repeat_interleave(SAMPLES_PER_CLASS)
        return templates[labels] + 0.3 * torch.randn(len(labels), 3, 16, 16, generator=generator), labels

    train = [experience(e * CLASSES_PER_EXPERIENCE) for e in range(EXPERIENCES)]
    test = [experience(e * CLASSES_PER_EXPERIENCE) for e in range(EXPERIENCES)]
    # Task label e on experience e, for the oracle router (the others ignore it).
    return tensors_benchmark(train_tensors=train, test_tensors=test, task_labels=list(range(EXPERIENCES)))


def trained_strategy(method: str, router: str) -> Any:
    torch.manual_seed(0)
    vit = VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=0)
    strategy = METHODS[method](vit, router=router, train_epochs=1, train_mb_size=16, eval_mb_size=16,
                               evaluator=EvaluationPlugin(loggers=[]))
    return strategy


def package_calls() -> tuple[list[tuple[str, str]], Callable[[FrameType, str, Any], None]]:
    """A list and a ``sys.setprofile`` function that appends to it (file in the package, qualified name) of
    every package function called, once each, in order of first call."""
    seen: list[tuple[str, str]] = []

    def profile(frame: FrameType, event: str, _: Any) -> None:
        path = Path(frame.f_code.co_filename)
        if event == "call" and PACKAGE in path.parents:
            key = (str(path.relative_to(PACKAGE)), frame.f_code.co_qualname)
            if key not in seen:
                seen.append(key)

    return seen, profile


def walk(strategy: Any, images: torch.Tensor, tasks: torch.Tensor, experience: Any) -> list[tuple[str, str]]:
    """(file in the package, qualified name) of every package function ``strategy.forward()`` calls."""
    strategy.experience, strategy.is_training = experience, False
    strategy.mbatch = [images, torch.zeros(len(images), dtype=torch.long), tasks]
    seen, profile = package_calls()

    strategy.model.eval()
    sys.setprofile(profile)
    try:
        with torch.no_grad():
            strategy.forward()
    finally:
        sys.setprofile(None)
    return seen


def training_walk(strategy: Any, experience: Any) -> list[tuple[str, str]]:
    """(file in the package, qualified name) of every package function ``strategy.train(experience)`` calls
    inside its training epoch (one step when the experience is one batch), in order of first call."""
    seen, profile = package_calls()

    epoch = strategy.training_epoch

    def traced_epoch(**kwargs: Any) -> None:
        sys.setprofile(profile)
        try:
            epoch(**kwargs)
        finally:
            sys.setprofile(None)

    strategy.training_epoch = traced_epoch
    try:
        strategy.train(experience)
    finally:
        del strategy.training_epoch
    return seen


def files_entered(calls: list[tuple[str, str]]) -> list[str]:
    """The package files of ``calls``, in order of first entry."""
    return list(dict.fromkeys(file for file, _ in calls))


def is_function(strategy: Any, qualname: str) -> bool:
    """Not a property, a dunder or a comprehension: a function a reader follows."""
    if "<" in qualname or qualname.rsplit(".", 1)[-1].startswith("__"):
        return False
    owner_name, _, attribute = qualname.rpartition(".")
    for cls in type(strategy.model).__mro__ if owner_name else ():
        if cls.__name__ == owner_name and isinstance(cls.__dict__.get(attribute), property):
            return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", choices=sorted(METHODS), default="CoLoR")
    parser.add_argument("--router", choices=("prototypes", "ridge", "gaussian", "oracle"), default="prototypes")
    parser.add_argument("--training-step", action="store_true",
                        help="trace one training step (the third experience's) instead of an evaluation batch")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    benchmark = tiny_stream()
    strategy = trained_strategy(args.method, args.router)
    if args.training_step:
        *earlier, last = benchmark.train_stream
        for experience in earlier:
            strategy.train(experience)
        calls = training_walk(strategy, last)
        functions = [call for call in calls if is_function(strategy, call[1])]
        print(f"\n{args.method}, router={args.router}, one training step (experience {len(earlier)}): "
              f"{len(functions)} functions in {len(files_entered(calls))} files")
        for file, qualname in calls:
            print(f"  {'' if is_function(strategy, qualname) else '(not counted) '}{qualname}  ({file})")
        print(f"files: {', '.join(files_entered(calls))}")
        return
    for experience in benchmark.train_stream:
        strategy.train(experience)
    tests = benchmark.test_stream
    several = [(e, i) for e in range(EXPERIENCES) for i in (0, 9)]
    batches = {"several experts": (torch.stack([tests[e].dataset[i][0] for e, i in several]),
                                   torch.tensor([e for e, _ in several])),
               "one expert": (torch.stack([tests[0].dataset[i][0] for i in range(4)]), torch.zeros(4, dtype=torch.long))}
    for name, (images, tasks) in batches.items():
        calls = walk(strategy, images, tasks, tests[0])
        routed = strategy.mb_routed_experts
        functions = [call for call in calls if is_function(strategy, call[1])]
        print(f"\n{args.method}, router={args.router}, a batch routed to {name} "
              f"({routed.tolist() if routed is not None else '-'}): {len(functions)} functions "
              f"in {len(files_entered(calls))} files")
        for file, qualname in calls:
            print(f"  {'' if is_function(strategy, qualname) else '(not counted) '}{qualname}  ({file})")


if __name__ == "__main__":
    main()
