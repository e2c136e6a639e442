"""The comparison runner: several methods on one benchmark, same backbone, seeds, epochs and batch.

    python -m benchmarks.compare --benchmark pacs
    python -m benchmarks.compare --benchmark split_tiny_imagenet --seeds 0 1 2 --wandb-project my-project
    python -m benchmarks.compare --benchmark pacs --methods CoLoR --rank 1 8 64 --name pacs_rank_ablation

Writes under ``benchmarks/results/<name>/`` (``<name>`` defaults to the benchmark):
``results.json`` (config and every run: accuracy matrix, average accuracy, forgetting,
routing accuracy, trainable parameters, wall and CPU time), ``runs.csv``,
``accuracy_matrices.csv``, ``summary.md`` (mean ± std over seeds, with the command) and
``accuracy.png``; Avalanche's text, CSV and Tensorboard logs under ``logs/``; a checkpoint per
CoLoR-family run under ``checkpoints/`` (after every experience, and every ``--checkpoint-epochs``
epochs) and every finished run's record under ``runs/``; and, with
``--wandb-project``, one W&B run per (method, seed) grouped by benchmark (``WANDB_MODE=offline``
works without network; the W&B files go under ``<name>/wandb``).

The CoLoR family (CoLoR, CoLoR++, CoLoR-oracle) runs for every seed in ``--seeds`` and every
``--rank`` x ``--k`` (the ablations); the prompt methods (S-Prompts, L2P), which also train only a
few parameters on the frozen backbone, for every seed (S-Prompts also for every ``--k``); the
baselines, which cost far more, for ``--baseline-seeds`` (default: the first seed).

``--resume`` continues an interrupted comparison in the same folder: finished runs are read back
from ``runs/``, a CoLoR-family run continues from its checkpoint (the accuracy matrix so far comes
back with it, so the results equal an uninterrupted comparison's), a baseline run starts over. Give the same
arguments as the interrupted command; a resumed run's wall and CPU seconds count its resumed part.

    python -m benchmarks.compare --benchmark pacs --resume

Under torchrun (``torchrun --nproc_per_node=N -m benchmarks.compare ...``) every run trains on N
processes (NCCL on GPUs, gloo on CPU; see :mod:`avalanche_color.distributed`): ``--batch-size`` is
then per process, only the methods in ``DISTRIBUTED_METHODS`` are allowed, ``--resume`` is not, and
only rank 0 writes results, records, checkpoints and logs and shows progress.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import shlex
import sys
import time
import warnings
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from avalanche.distributed import DistributedHelper
from avalanche.logging import CSVLogger, TensorboardLogger, TextLogger
from avalanche.training.determinism.rng_manager import RNGManager
from timm.models.vision_transformer import VisionTransformer
from tqdm import tqdm

from benchmarks.backbones import data_config, load_backbone, with_head
from benchmarks.compare.methods import (COLOR_ROUTING, FROZEN_BACKBONE, METHODS, PROTOTYPE_ROUTED, Budget, Hyperparameters,
                                build_strategy, needs_task_labels, trainable_parameters_per_experience)
from avalanche_color import train_stream
from avalanche_color.utils.files import write_atomically
from avalanche_color.training.distributed import is_distributed
from benchmarks.streams.registry import BENCHMARKS, BenchmarkSpec, benchmark_spec
from benchmarks.reporting import forgetting, markdown_table, plot_accuracy, summary_rows, weighted_mean, write_csv

RESULTS = Path(__file__).parents[1] / "results"
LOGGERS = ("text", "csv", "tensorboard")
# The methods that train on several processes: those built on RoutedExpertsTemplate.
DISTRIBUTED_METHODS = (*COLOR_ROUTING, "S-Prompts")
PER_EXPERIENCE = re.compile(r"^(?P<metric>\w+)/eval_phase/test_stream/Task\d+/Exp(?P<experience>\d+)$")


@dataclass(frozen=True)
class ComparisonConfig:
    """One comparison. ``backbone``, ``ks`` and ``out`` default to the benchmark's."""

    benchmark: str
    methods: tuple[str, ...] = METHODS
    seeds: tuple[int, ...] = (0,)
    baseline_seeds: Optional[tuple[int, ...]] = None
    epochs: int = 5
    batch_size: int = 64
    backbone: Optional[str] = None
    data: Optional[Path] = None
    ranks: tuple[int, ...] = (8,)
    ks: Optional[tuple[int, ...]] = None
    color_lr: float = 0.05
    baseline_lr: float = 0.01
    train_per_class: Optional[int] = None
    device: str = "auto"
    out: Optional[Path] = None
    loggers: tuple[str, ...] = LOGGERS
    wandb_project: Optional[str] = None
    wandb_entity: Optional[str] = None
    resume: bool = False
    checkpoint_epochs: Optional[int] = None
    command: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        benchmark_spec(self.benchmark)
        for name in ("data", "out"):  # paths may come as strings (notebooks, JSON configs)
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))
        for name, values, allowed in (("methods", self.methods, METHODS), ("loggers", self.loggers, LOGGERS)):
            unknown = [v for v in values if v not in allowed]
            if unknown:
                raise ValueError(f"{name} must be among {allowed}, got {unknown}")
        for name in ("seeds", "ranks", "methods"):
            if not getattr(self, name):
                raise ValueError(f"{name} must not be empty")
        if self.checkpoint_epochs is not None and self.checkpoint_epochs < 1:
            raise ValueError(f"checkpoint_epochs must be a positive integer, got {self.checkpoint_epochs}")
        for name, values in (("ranks", self.ranks), ("ks", self.ks or ()),
                             ("epochs", (self.epochs,)), ("batch_size", (self.batch_size,))):
            if any(v < 1 for v in values):
                raise ValueError(f"{name} must be positive integers, got {values}")


def run_comparison(config: ComparisonConfig, progress: bool = True) -> dict[str, Any]:
    """Runs every (method, variant, seed) of ``config``, writes the results, and returns them."""
    spec = benchmark_spec(config.benchmark)
    if is_distributed():
        _check_distributed(config)
    main_process = DistributedHelper.is_main_process  # True when not distributed
    progress = progress and main_process
    out = config.out or RESULTS / config.benchmark
    if main_process:
        out.mkdir(parents=True, exist_ok=True)
    if is_distributed():  # each rank's own device (cuda:<rank> or cpu)
        device = str(DistributedHelper.make_device())
    else:
        device = config.device if config.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    backbone = _backbone(config.backbone or spec.backbone)
    plan = _plan(config, spec)
    streams: dict[tuple[int, bool], Any] = {}

    runs = []
    with tqdm(total=len(plan), desc=f"{config.benchmark}: runs", unit="run", disable=not progress) as bar:
        for method, label, seed, rank, k in plan:
            bar.set_postfix_str(f"{label}, seed {seed}")
            key = (seed, needs_task_labels(method))
            if key not in streams:
                streams[key] = _build_stream(spec, config, backbone, seed, key[1])
            hp = Hyperparameters(color_lr=config.color_lr, color_rank=rank, color_k=k, baseline_lr=config.baseline_lr)
            runs.append(_run(method, label, seed, rank, k, streams[key], spec, backbone,
                             Budget(config.epochs, config.batch_size, device), hp, config, out))
            bar.update()

    result = {"config": _jsonable(asdict(config)), "device": _device_name(device), "runs": runs}
    if is_distributed():
        result["world_size"] = DistributedHelper.world_size
    if not main_process:  # every rank holds the same results; rank 0 writes them
        result["table"] = markdown_table(summary_rows(runs))
        return result
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    write_csv(runs, out)
    table = markdown_table(summary_rows(runs))
    command = f"`{config.command}`\n\n" if config.command else ""
    (out / "summary.md").write_text(
        f"{command}{config.benchmark} ({spec.scenario}), backbone {config.backbone or spec.backbone}, "
        f"{config.epochs} epochs per experience, batch {config.batch_size}, device {result['device']}; "
        f"accuracy and forgetting in % after the last experience (mean ± std over seeds)\n\n{table}\n")
    plot_accuracy(runs, out / "accuracy.png", title=f"{config.benchmark} ({spec.scenario})")
    result["table"] = table
    return result


def _check_distributed(config: ComparisonConfig) -> None:
    """Refuses what does not run on several processes."""
    unsupported = [method for method in config.methods if method not in DISTRIBUTED_METHODS]
    if unsupported:
        raise ValueError(f"methods {unsupported} do not run under torchrun; "
                         f"with several processes methods must be among {DISTRIBUTED_METHODS}")
    if config.resume:
        raise ValueError("resume is not supported under torchrun: run the interrupted comparison in one process")


def _plan(config: ComparisonConfig, spec: BenchmarkSpec) -> list[tuple[str, str, int, int, int]]:
    """(method, label, seed, rank, k) for every run; labels name the variant when ablating."""
    ks = config.ks or (spec.k,)
    ablating = len(config.ranks) > 1 or len(ks) > 1
    plan = []
    for method in config.methods:
        if method in COLOR_ROUTING:
            for rank in config.ranks:
                for k in ks:
                    label = f"{method} r={rank} k={k}" if ablating else method
                    plan += [(method, label, seed, rank, k) for seed in config.seeds]
        elif method in FROZEN_BACKBONE:  # the prompt methods: no rank; only S-Prompts has a k
            method_ks = ks if method in PROTOTYPE_ROUTED else ks[:1]
            for k in method_ks:
                label = f"{method} k={k}" if len(method_ks) > 1 else method
                plan += [(method, label, seed, config.ranks[0], k) for seed in config.seeds]
        else:
            plan += [(method, method, seed, config.ranks[0], ks[0]) for seed in config.baseline_seeds or config.seeds[:1]]
    return plan


def _backbone(spec: str) -> VisionTransformer:
    if spec == "digits":
        from benchmarks.streams.digits import digits_split, pretrained_vit, small_vit
        model = small_vit(0)
        model.load_state_dict(pretrained_vit(digits_split(0), RESULTS / "cache"))
        return model.eval()
    return load_backbone(spec)


def _build_stream(spec: BenchmarkSpec, config: ComparisonConfig, backbone: VisionTransformer, seed: int,
                  task_labels: bool):
    data = data_config(backbone)
    return spec.build(config.data, data["input_size"][-1], data["mean"], data["std"], seed, task_labels,
                      config.train_per_class)


def _run(method: str, label: str, seed: int, rank: int, k: int, benchmark, spec: BenchmarkSpec,
         backbone: VisionTransformer, budget: Budget, hp: Hyperparameters, config: ComparisonConfig,
         out: Path) -> dict[str, Any]:
    name = f"{_slug(label)}_seed{seed}"
    record = out / "runs" / f"{name}.json"
    if config.resume and record.exists():  # finished before the interruption
        return json.loads(record.read_text())
    RNGManager.set_random_seeds(seed)
    main_process = DistributedHelper.is_main_process  # True when not distributed
    with ExitStack() as stack:
        # Under torchrun the metrics are gathered on every rank; rank 0 alone logs them.
        loggers = (_avalanche_loggers(config.loggers, out / "logs" / name, stack, append=config.resume)
                   if main_process else [])
        wandb_logger = _wandb_logger(config, label, method, seed, rank, k, out) if main_process else None
        if wandb_logger is not None:
            loggers.append(stack.enter_context(wandb_logger))  # finished even if training fails
        strategy = build_strategy(method, lambda classes: with_head(copy.deepcopy(backbone), classes),
                                  spec.num_classes, budget, hp, loggers)
        count = len(benchmark.train_stream)
        test_sizes = [len(experience.dataset) for experience in benchmark.test_stream]
        wall, cpu = time.perf_counter(), time.process_time()
        # After each experience, evaluated on the experiences seen so far: oracle routing has no
        # expert for a future task, and after the last one this is the whole test stream.
        checkpoint = out / "checkpoints" / f"{name}.ckpt" if method in COLOR_ROUTING and main_process else None
        records = train_stream(strategy, benchmark, checkpoint=checkpoint, resume=config.resume,
                               every_n_epochs=config.checkpoint_epochs if checkpoint else None)
        matrix = [_per_experience(metrics, "Top1_Acc_Exp", count) for metrics in records]
        metrics = records[-1]
        run = {
            "label": label, "method": method, "seed": seed,
            "rank": rank if method in COLOR_ROUTING else None, "k": k if method in PROTOTYPE_ROUTED else None,
            "accuracy_matrix": matrix,
            "average_accuracy": weighted_mean(matrix[-1], test_sizes),
            "forgetting": forgetting(matrix),
            "routing_accuracy": (weighted_mean(_per_experience(metrics, "RoutingAcc_Exp", count), test_sizes)
                                 if method in PROTOTYPE_ROUTED else None),
            "trainable_parameters_per_experience": trainable_parameters_per_experience(strategy),
            "wall_seconds": time.perf_counter() - wall,
            "cpu_seconds": time.process_time() - cpu,
        }
        if wandb_logger is not None:
            wandb_logger.run.summary.update({key: value for key, value in run.items()
                                             if isinstance(value, (int, float))})
    if main_process:
        write_atomically(record, (json.dumps(run, indent=2) + "\n").encode())
    return run


def _per_experience(metrics: dict[str, float], metric: str, count: int) -> list[Optional[float]]:
    """An Avalanche per-experience metric as a list (None for experiences not evaluated yet)."""
    row: list[Optional[float]] = [None] * count
    for name, value in metrics.items():
        match = PER_EXPERIENCE.match(name)
        if match and match["metric"] == metric:
            row[int(match["experience"])] = value
    return row


def _avalanche_loggers(names: tuple[str, ...], folder: Path, stack: ExitStack, append: bool = False) -> list:
    folder.mkdir(parents=True, exist_ok=True)
    loggers: list = []
    if "text" in names:
        loggers.append(TextLogger(stack.enter_context(open(folder / "log.txt", "a" if append else "w"))))
    if "csv" in names:
        loggers.append(CSVLogger(log_folder=str(folder / "csv")))
    if "tensorboard" in names:
        loggers.append(TensorboardLogger(tb_log_dir=folder / "tensorboard"))
    for logger in loggers:
        stack.callback(getattr(logger, "close", lambda: None))
    return loggers


def _wandb_logger(config: ComparisonConfig, label: str, method: str, seed: int, rank: int, k: int, out: Path):
    if config.wandb_project is None:
        return None
    from avalanche_color import WandBLogger
    folder = out / "wandb"
    folder.mkdir(parents=True, exist_ok=True)
    run_config = {**_jsonable(asdict(config)), "method": method, "seed": seed, "rank": rank, "k": k}
    return WandBLogger(project_name=config.wandb_project, run_name=f"{config.benchmark} {label} seed {seed}",
                       dir=str(folder), config=run_config, save_code=False,
                       params={"entity": config.wandb_entity, "group": config.benchmark, "job_type": label,
                               "reinit": "create_new"})  # one run per (method, seed), even in a notebook


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9+=-]+", "_", label).strip("_")


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value) if isinstance(value, Path) else value


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"cpu ({torch.get_num_threads()} threads)"


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--benchmark", required=True, choices=sorted(BENCHMARKS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--baseline-seeds", nargs="+", type=int, help="default: the first of --seeds")
    parser.add_argument("--epochs", type=int, default=ComparisonConfig.epochs)
    parser.add_argument("--batch-size", type=int, default=ComparisonConfig.batch_size)
    parser.add_argument("--backbone", help="timm name, checkpoint file, 'offline' or 'digits' (default: the benchmark's)")
    parser.add_argument("--data", type=Path, help="the data set's zip or folder (default: the benchmark's)")
    parser.add_argument("--rank", nargs="+", type=int, default=list(ComparisonConfig.ranks))
    parser.add_argument("--k", nargs="+", type=int, help="prototypes per experience (default: the paper's rule)")
    parser.add_argument("--color-lr", type=float, default=ComparisonConfig.color_lr)
    parser.add_argument("--baseline-lr", type=float, default=ComparisonConfig.baseline_lr)
    parser.add_argument("--train-per-class", type=int, help="subsample the training data (split_tiny_imagenet)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--name", help="output folder under benchmarks/results (default: the benchmark)")
    parser.add_argument("--loggers", nargs="*", default=list(LOGGERS), choices=LOGGERS)
    parser.add_argument("--wandb-project", help="log every run to this W&B project")
    parser.add_argument("--wandb-entity")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted comparison in the same folder from its checkpoints")
    parser.add_argument("--checkpoint-epochs", type=int,
                        help="also checkpoint CoLoR runs every this many epochs (default: after each experience)")
    args = parser.parse_args(argv)
    # Avalanche's notices about its own internals, not about this run: kept off the terminal.
    warnings.filterwarnings("ignore", message="No loggers specified")
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"avalanche\.")
    command = "python -m benchmarks.compare " + shlex.join(sys.argv[1:] if argv is None else argv)
    config = ComparisonConfig(
        benchmark=args.benchmark, methods=tuple(args.methods), seeds=tuple(args.seeds),
        baseline_seeds=tuple(args.baseline_seeds) if args.baseline_seeds else None, epochs=args.epochs,
        batch_size=args.batch_size, backbone=args.backbone, data=args.data, ranks=tuple(args.rank),
        ks=tuple(args.k) if args.k else None, color_lr=args.color_lr, baseline_lr=args.baseline_lr,
        train_per_class=args.train_per_class, device=args.device,
        out=RESULTS / args.name if args.name else None, loggers=tuple(args.loggers),
        wandb_project=args.wandb_project, wandb_entity=args.wandb_entity, resume=args.resume,
        checkpoint_epochs=args.checkpoint_epochs, command=command)
    if _launched_by_torchrun():
        cuda = torch.cuda.is_available()
        DistributedHelper.init_distributed(config.seeds[0], backend="nccl" if cuda else "gloo", use_cuda=cuda)
    main_process = DistributedHelper.is_main_process  # read before the process group goes
    try:
        result = run_comparison(config, progress=main_process)
    finally:
        if is_distributed():
            torch.distributed.destroy_process_group()
    if main_process:
        print(f"\n{result['table']}\n\nwritten to {config.out or RESULTS / config.benchmark}")
    return result


def _launched_by_torchrun() -> bool:
    """Whether torchrun started this process as one of several."""
    return "LOCAL_RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1

