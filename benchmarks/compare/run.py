"""One run of a comparison: a method on a benchmark with one seed, trained and evaluated experience by experience."""

from __future__ import annotations

import copy
import json
import re
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, Optional

from avalanche.distributed import DistributedHelper
from avalanche.training.determinism.rng_manager import RNGManager
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models.vision_transformer import VisionTransformer

from avalanche_color import train_stream
from avalanche_color.utils.files import write_atomically
from benchmarks.backbones import data_config, with_head
from benchmarks.compare.config import ComparisonConfig
from benchmarks.compare.loggers import avalanche_loggers, wandb_logger
from benchmarks.compare.methods import (COLOR_ROUTING, JOINT, LORA_METHODS, PROTOTYPE_ROUTED, Budget,
                                        Hyperparameters, build_strategy, trainable_parameters_per_experience)
from benchmarks.compare.results import slug
from benchmarks.reporting import forgetting, weighted_mean
from benchmarks.streams.registry import BenchmarkSpec

PER_EXPERIENCE = re.compile(r"^(?P<metric>\w+)/eval_phase/test_stream/Task\d+/Exp(?P<experience>\d+)$")


def build_stream(spec: BenchmarkSpec, config: ComparisonConfig, backbone: VisionTransformer, seed: int,
                  task_labels: bool):
    data = data_config(backbone)
    mean, std = ((IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD) if config.normalisation == "imagenet"
                 else (data["mean"], data["std"]))
    return spec.build(config.data, data["input_size"][-1], mean, std, seed, task_labels, config.train_per_class)


def run_method(method: str, label: str, seed: int, rank: int, k: int, benchmark, spec: BenchmarkSpec,
         backbone: VisionTransformer, budget: Budget, hp: Hyperparameters, config: ComparisonConfig,
         out: Path) -> dict[str, Any]:
    name = f"{slug(label)}_seed{seed}"
    record = out / "runs" / f"{name}.json"
    if config.resume and record.exists():  # finished before the interruption
        return json.loads(record.read_text())
    RNGManager.set_random_seeds(seed)
    main_process = DistributedHelper.is_main_process  # True when not distributed
    with ExitStack() as stack:
        # Under torchrun the metrics are gathered on every rank; rank 0 alone logs them.
        loggers = (avalanche_loggers(config.loggers, out / "logs" / name, stack, append=config.resume)
                   if main_process else [])
        wandb = wandb_logger(config, label, method, seed, rank, k, out) if main_process else None
        if wandb is not None:
            loggers.append(stack.enter_context(wandb))  # finished even if training fails
        strategy = build_strategy(method, lambda classes: with_head(copy.deepcopy(backbone), classes),
                                  spec.num_classes, budget, hp, loggers)
        count = len(benchmark.test_stream)  # the accuracy matrix's columns
        test_sizes = [len(experience.dataset) for experience in benchmark.test_stream]
        wall, cpu = time.perf_counter(), time.process_time()
        # After each experience, evaluated on the experiences seen so far: oracle routing has no
        # expert for a future task, and after the last one this is the whole test stream. A test
        # stream not paired with the training stream (CORe50's one test set) is evaluated whole.
        checkpoint = out / "checkpoints" / f"{name}.ckpt" if method in COLOR_ROUTING and main_process else None
        # Every method, Avalanche's strategies too, loads with --workers worker processes.
        loaders = dict(num_workers=config.workers, persistent_workers=config.workers > 0)
        if method in JOINT:
            records = [train_jointly(strategy, benchmark, loaders)]
        else:
            evaluate = None if spec.paired_test_stream else evaluate_whole_stream(benchmark, loaders)
            records = train_stream(strategy, benchmark, checkpoint=checkpoint, resume=config.resume,
                                   every_n_epochs=config.checkpoint_epochs if checkpoint else None,
                                   evaluate=evaluate, loader_options=loaders)
        # A joint run's matrix is one row (after its one training, every experience): its average
        # accuracy is over the whole test stream, its forgetting 0, and the plot draws it as a level.
        matrix = [_per_experience(metrics, "Top1_Acc_Exp", count) for metrics in records]
        metrics = records[-1]
        run = {
            "label": label, "method": method, "seed": seed,
            "rank": rank if method in LORA_METHODS else None, "k": k if method in PROTOTYPE_ROUTED else None,
            "accuracy_matrix": matrix,
            "average_accuracy": weighted_mean(matrix[-1], test_sizes),
            "forgetting": forgetting(matrix),
            # An expert is right for a test sample when it was trained on the training experience
            # the sample's test experience belongs to; where none does, there is nothing to count.
            "routing_accuracy": (weighted_mean(_per_experience(metrics, "RoutingAcc_Exp", count), test_sizes)
                                 if method in PROTOTYPE_ROUTED and spec.paired_test_stream else None),
            "trainable_parameters_per_experience": trainable_parameters_per_experience(strategy),
            "wall_seconds": time.perf_counter() - wall,
            "cpu_seconds": time.process_time() - cpu,
        }
        if wandb is not None:
            wandb.run.summary.update({key: value for key, value in run.items()
                                             if isinstance(value, (int, float))})
    if main_process:
        write_atomically(record, (json.dumps(run, indent=2) + "\n").encode())
    return run


def train_jointly(strategy, benchmark, loader_options: dict[str, Any]) -> dict[str, float]:
    """Train on all experiences at once (JointTraining), then evaluate on the whole test stream."""
    strategy.train(benchmark.train_stream, **loader_options)
    return evaluate_whole_stream(benchmark, loader_options)(strategy, 0)


def evaluate_whole_stream(benchmark, loader_options: dict[str, Any]) -> Callable[[Any, int], dict[str, float]]:
    """``train_stream``'s evaluation on the whole test stream after every training experience:
    the numeric metrics of ``strategy.eval(benchmark.test_stream, **loader_options)``."""
    def evaluate(strategy, index: int) -> dict[str, float]:
        metrics = strategy.eval(benchmark.test_stream, **loader_options)
        return {name: value for name, value in metrics.items()
                if isinstance(value, (int, float)) and not isinstance(value, bool)}
    return evaluate


def _per_experience(metrics: dict[str, float], metric: str, count: int) -> list[Optional[float]]:
    """An Avalanche per-experience metric as a list (None for experiences not evaluated yet)."""
    row: list[Optional[float]] = [None] * count
    for name, value in metrics.items():
        match = PER_EXPERIENCE.match(name)
        if match and match["metric"] == metric:
            row[int(match["experience"])] = value
    return row
