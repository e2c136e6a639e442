"""Why a method scores near its floor on a class-incremental stream: learning, forgetting or the head.

For each method it trains the runner's strategy (the runner's options for it, any of which a
``NAME:key=value,...`` item replaces) on a small held-out class-incremental stream of
Tiny-ImageNet and prints, in %:

* ``diag``: accuracy on each experience's test images right after learning it (the diagonal of
  the accuracy matrix; low: the method does not learn the experience at this budget and lr);
* ``end``: accuracy over every test image after the last experience (the table's number);
* ``aware``: the same, with the experience's identity given: each image's logits restricted to
  its experience's classes (high while ``end`` is low: the features hold the classes and the one
  head ranks them wrongly across experiences);
* ``last``: the share of the end's predictions that fall in the last experience's classes (1/T
  with no recency bias: 20% for 5 experiences), and per experience, where ``recency`` asks;
* ``probe`` (with ``--probe``): the nearest class mean on the adapted model's features at the end
  (cosine to the means of every class's training images, no head): what the features hold, apart
  from the head (the training-free NCM row is the same on the frozen backbone).

The stream: ``--classes`` (default the first 10) of Tiny-ImageNet's first 100 classes in
``wnids.txt`` order, which the offline benchmark tables never use, ``--train-per-class`` training
images each (seeded), the 50 validation images of each as the test set, ``--experiences``
experiences of equal class count, relabelled 0..C-1 in the order given.

    OMP_NUM_THREADS=1 python -m benchmarks.investigations.starved_methods \\
        --backbone vit_tiny_patch16_224-imagenet.safetensors --architecture vit_tiny_patch16_224 \\
        --data FOLDER --image-size 112 --epochs 1 \\
        --methods NCM InfLoRA InfLoRA:lr=5e-4 L2P SD-LoRA

The weights file may be named without its folder (found in ``AVALANCHE_COLOR_MODELS``), and
``--data`` left out (the Tiny-ImageNet zip in ``AVALANCHE_COLOR_DATA``).
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from avalanche.benchmarks import nc_benchmark
from avalanche.core import SupervisedPlugin
from avalanche.training.plugins import EvaluationPlugin
from torch.utils.data import TensorDataset

from avalanche_color import backbone_data_config
from avalanche_color.baselines.training_free import pooled_features
from avalanche_color.experts.routed_vit import backbone_images
from avalanche_color.benchmarks.stream_building import subsample_per_class
from avalanche_color.benchmarks.tiny_imagenet import FILE_NAME as TINY_FILE
from avalanche_color.benchmarks.tiny_imagenet import PRETRAIN_CLASSES, load_tiny_imagenet
from avalanche_color.benchmarks.transforms import vit_transforms
from avalanche_color.runner.backbone_loading import load_backbone
from avalanche_color.runner.config import RunConfig
from avalanche_color.runner.methods import MethodRun, method

STORED_SIDE = 32  # the offline zip's Tiny-ImageNet side


@dataclass
class Outputs(SupervisedPlugin):
    """Records every evaluated mini-batch's logits and labels (on the CPU)."""

    logits: list[torch.Tensor] = field(default_factory=list)
    labels: list[torch.Tensor] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__()

    def after_eval_iteration(self, strategy: Any, **kwargs: Any) -> None:
        self.logits.append(strategy.mb_output.detach().float().cpu())
        self.labels.append(strategy.mb_y.detach().cpu())

    def take(self) -> tuple[torch.Tensor, torch.Tensor]:
        logits, labels = torch.cat(self.logits), torch.cat(self.labels)
        self.logits, self.labels = [], []
        return logits, labels


@dataclass
class Diagnosis:
    """One method's numbers on one stream (fractions, not %)."""

    label: str
    diagonal: list[float]
    end: float
    task_aware: float
    last_share: float
    per_experience_end: list[float]
    recency: list[float]  # after experience i: the share of predictions on experiences 0..i in i's classes
    seconds: float
    probe: Optional[float] = None

    def row(self) -> str:
        diagonal = " ".join(f"{100 * a:5.1f}" for a in self.diagonal)
        ends = " ".join(f"{100 * a:5.1f}" for a in self.per_experience_end)
        return (f"{self.label:<34} diag {diagonal} | mean {100 * np.mean(self.diagonal):5.1f}"
                f" | end {100 * self.end:5.1f} ({ends}) | aware {100 * self.task_aware:5.1f} | last {100 * self.last_share:5.1f}"
                + ("" if self.probe is None else f" | probe {100 * self.probe:5.1f}") + f" | {self.seconds:5.0f} s")


def parse_item(item: str) -> tuple[str, dict[str, Any]]:
    """``NAME`` or ``NAME:key=value,key=value`` (values as Python literals, else strings)."""
    name, _, rest = item.partition(":")
    overrides: dict[str, Any] = {}
    for pair in filter(None, rest.split(",")):
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"expected key=value in {item!r}, got {pair!r}")
        try:
            overrides[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            overrides[key.strip()] = value.strip()
    return name, overrides


def held_out_stream(data: Optional[Path], classes: Sequence[int], train_per_class: int, experiences: int,
                    image_size: int, mean, std, interpolation: str, seed: int):
    """``classes`` of Tiny-ImageNet's pretraining half, relabelled 0..C-1, as ``experiences`` experiences."""
    if any(not 0 <= c < PRETRAIN_CLASSES for c in classes):
        raise ValueError(f"classes must lie in Tiny-ImageNet's first {PRETRAIN_CLASSES} (held out of the tables), "
                         f"got {list(classes)}")
    if len(classes) % experiences:
        raise ValueError(f"experiences must divide the {len(classes)} classes, got experiences={experiences}")
    tiny = load_tiny_imagenet(data, image_size=STORED_SIDE)
    relabel = torch.full((len(tiny.wnids),), -1, dtype=torch.long)
    relabel[torch.tensor(list(classes))] = torch.arange(len(classes))
    train_keep = relabel[tiny.train_labels] >= 0
    train_images, train_labels = tiny.train_images[train_keep], relabel[tiny.train_labels[train_keep]]
    keep = subsample_per_class(train_labels, train_per_class, np.random.default_rng(seed))
    train_images, train_labels = train_images[keep], train_labels[keep]
    test_keep = relabel[tiny.val_labels] >= 0
    test_images, test_labels = tiny.val_images[test_keep], relabel[tiny.val_labels[test_keep]]
    train_transform, eval_transform = vit_transforms(image_size, mean, std, interpolation)
    return nc_benchmark(TensorDataset(train_images, train_labels), TensorDataset(test_images, test_labels),
                        n_experiences=experiences, task_labels=False, shuffle=False,
                        fixed_class_order=list(range(len(classes))), class_ids_from_zero_in_each_exp=False,
                        train_transform=train_transform, eval_transform=eval_transform)


def build(name: str, overrides: dict[str, Any], vit, config: RunConfig, num_classes: int, num_experiences: int,
          rank: int, k: Optional[int]):
    """The runner's strategy for method ``name`` (its options as the runner gives them), ``overrides`` replacing
    some (``train_epochs`` and ``train_mb_size`` too), with no metric computed (:class:`Outputs` records)."""
    entry = method(name)
    budget = dict(train_mb_size=config.batch_size, train_epochs=config.epochs)
    run = MethodRun(config=config, rank=rank if entry.lora else None, k=k if entry.prototypes else None,
                    num_classes=num_classes, backbone=lambda classes: copy.deepcopy(vit),
                    strategy_options=dict(eval_mb_size=128, device="cpu", evaluator=EvaluationPlugin(loggers=[])),
                    num_experiences=num_experiences)
    options = {**entry.options(run), **overrides}
    run.strategy_options.update({key: options.pop(key, value) for key, value in budget.items()})
    return entry.build_strategy(run, options), options


@torch.no_grad()
def adapted_features(model, x: torch.Tensor) -> torch.Tensor:
    """The features the model's head reads: a LoRA-sum model's pooled feature with every component summed in,
    L2P's head input with the prompts each sample selects, a fine-tuned timm ViT's pooled feature (the whole-ViT
    baselines; FT-masked wraps it with its head in Avalanche's FeatureExtractorModel)."""
    if hasattr(model, "select_prompts"):
        x = backbone_images(model.backbone, x)
        return model.features(x, model.select_prompts(x)[1])
    model = getattr(model, "feature_extractor", model)  # FeatureExtractorModel's .features is a tensor
    if hasattr(model, "features"):
        return model.features(x)
    if hasattr(model, "forward_head"):
        return pooled_features(model, x)
    raise ValueError(f"--probe needs a model with features(x) (LoRA peers, L2P) or a timm ViT, got "
                     f"{type(model).__name__}")


@torch.no_grad()
def ncm_probe(model, benchmark, batch: int = 128) -> float:
    """Nearest-class-mean accuracy (cosine) over the whole test stream on the model's features."""
    model.eval()

    def embed(stream) -> tuple[torch.Tensor, torch.Tensor]:
        features, labels = [], []
        for experience in stream:
            dataset = experience.dataset.eval()
            for start in range(0, len(dataset), batch):
                items = [dataset[i] for i in range(start, min(start + batch, len(dataset)))]
                x = torch.stack([item[0] for item in items])
                features.append(torch.nn.functional.normalize(adapted_features(model, x).float(), dim=-1))
                labels.append(torch.tensor([int(item[1]) for item in items]))
        return torch.cat(features), torch.cat(labels)

    train, train_labels = embed(benchmark.train_stream)
    test, test_labels = embed(benchmark.test_stream)
    classes = train_labels.unique()
    means = torch.nn.functional.normalize(torch.stack([train[train_labels == c].mean(0) for c in classes]), dim=-1)
    return (classes[(test @ means.T).argmax(1)] == test_labels).float().mean().item()


def diagnose(label: str, strategy, benchmark, probe: bool = False) -> Diagnosis:
    recorder = Outputs()
    strategy.plugins.append(recorder)
    experience_classes = [sorted(exp.classes_in_this_experience) for exp in benchmark.train_stream]
    start = time.perf_counter()
    diagonal, recency = [], []
    for index, experience in enumerate(benchmark.train_stream):
        strategy.train(experience)
        strategy.eval(benchmark.test_stream[: index + 1])
        logits, labels = recorder.take()
        predicted = logits.argmax(1)
        own = torch.isin(labels, torch.tensor(experience_classes[index]))
        diagonal.append((predicted[own] == labels[own]).float().mean().item())
        recency.append(torch.isin(predicted, torch.tensor(experience_classes[index])).float().mean().item())
    seconds = time.perf_counter() - start
    # logits and labels are now the end's, over the whole test stream
    per_experience_end, aware_correct = [], 0
    for classes in experience_classes:
        mine = torch.isin(labels, torch.tensor(classes))
        per_experience_end.append((predicted[mine] == labels[mine]).float().mean().item())
        restricted = logits[mine][:, classes].argmax(1)
        aware_correct += int((torch.tensor(classes)[restricted] == labels[mine]).sum())
    return Diagnosis(label, diagonal, (predicted == labels).float().mean().item(), aware_correct / len(labels),
                     recency[-1], per_experience_end, recency, seconds,
                     ncm_probe(strategy.model, benchmark) if probe else None)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbone", required=True, help="weights file (bare name: in $AVALANCHE_COLOR_MODELS)")
    parser.add_argument("--architecture", required=True, help="timm architecture, e.g. vit_tiny_patch16_224")
    parser.add_argument("--data", type=Path, help=f"folder holding {TINY_FILE}, or the file (default: "
                                                  "$AVALANCHE_COLOR_DATA)")
    parser.add_argument("--image-size", type=int, default=112)
    parser.add_argument("--methods", nargs="+", default=["NCM", "InfLoRA", "L2P", "SD-LoRA"],
                        help="runner method names, each optionally NAME:key=value,... replacing its options")
    parser.add_argument("--classes", type=int, nargs="+", default=list(range(10)),
                        help=f"Tiny-ImageNet class ids (wnids.txt positions) below {PRETRAIN_CLASSES}")
    parser.add_argument("--experiences", type=int, default=5)
    parser.add_argument("--train-per-class", type=int, default=100)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rank", type=int, default=8, help="the runner's default rank")
    parser.add_argument("--k", type=int, default=5, help="prototypes per expert of CoLoR and S-Prompts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--recency", action="store_true", help="also print the recency share after each experience")
    parser.add_argument("--probe", action="store_true",
                        help="also the nearest class mean on the adapted features at the end (LoRA peers, L2P, "
                             "the whole-ViT baselines)")
    parser.add_argument("--json", type=Path, help="append each method's numbers to this file (JSON lines)")
    args = parser.parse_args(argv)

    data = args.data / TINY_FILE if args.data is not None and args.data.is_dir() else args.data
    vit = load_backbone(args.backbone, architecture=args.architecture, image_size=args.image_size)
    preprocessing = backbone_data_config(vit)
    benchmark = held_out_stream(data, args.classes, args.train_per_class, args.experiences, args.image_size,
                                preprocessing["mean"], preprocessing["std"], preprocessing["interpolation"],
                                args.seed)
    config = RunConfig(benchmark="split_tiny_imagenet", epochs=args.epochs, batch_size=args.batch_size)
    print(f"{args.architecture} at {args.image_size} px; classes {args.classes}, {args.experiences} experiences, "
          f"{args.train_per_class} training images per class; {args.epochs} epoch(s), batch {args.batch_size}, "
          f"seed {args.seed}")
    for item in args.methods:
        name, overrides = parse_item(item)
        torch.manual_seed(args.seed)
        strategy, options = build(name, overrides, vit, config, len(args.classes), args.experiences, args.rank, args.k)
        result = diagnose(item, strategy, benchmark, args.probe)
        print(result.row(), flush=True)
        if args.recency:
            print(" " * 34, "recency", " ".join(f"{100 * r:5.1f}" for r in result.recency), flush=True)
        if args.json is not None:
            with args.json.open("a") as file:
                file.write(json.dumps({**result.__dict__, "options": {k: repr(v) for k, v in options.items()},
                                       "epochs": args.epochs, "batch_size": args.batch_size,
                                       "image_size": args.image_size, "seed": args.seed}) + "\n")


if __name__ == "__main__":
    main()
