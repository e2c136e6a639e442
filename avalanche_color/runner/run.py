"""One run of a comparison: a method on a benchmark with one seed (:class:`PlannedRun`), trained and evaluated
experience by experience, with its loggers (Avalanche's text, CSV and Tensorboard loggers, and W&B)."""

from __future__ import annotations

import copy
import json
import re
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional, Sequence

from avalanche.distributed import DistributedHelper
from avalanche.evaluation.metrics import accuracy_metrics, forgetting_metrics
from avalanche.logging import BaseLogger, CSVLogger, TensorboardLogger, TextLogger
from avalanche.training.determinism.rng_manager import RNGManager
from avalanche.training.plugins import EvaluationPlugin
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models.vision_transformer import VisionTransformer

from avalanche_color import (LearningCheckPlugin, ResumePlugin, TrainingProgress, backbone_data_config,
                             evaluate_trained_experts, experience_classes, routing_accuracy_metrics, train_stream,
                             write_atomically)
from avalanche_color.benchmarks.registry import BenchmarkSpec, benchmark_spec
from avalanche_color.benchmarks.requests import StreamRequest
from avalanche_color.runner.backbone_loading import with_head
from avalanche_color.runner.config import RunConfig, config_record, jsonable
from avalanche_color.runner.methods import MethodRun, method
from avalanche_color.runner.report import forgetting, weighted_mean

# Task<t>/ is absent where the experiences declare no task labels (benchmark_from_datasets streams).
PER_EXPERIENCE = re.compile(r"^(?P<metric>\w+)/eval_phase/test_stream/(?:Task\d+/)?Exp(?P<experience>\d+)$")
EVAL_BATCH = 256


class PlannedRun(NamedTuple):
    """One run: the method, its label in the tables, the seed, and its rank and k (None where it takes none)."""

    method: str
    label: str
    seed: int
    rank: Optional[int]
    k: Optional[int]


class LearningRate(NamedTuple):
    """A learning rate given to a run in place of its method's own, and how it was chosen."""

    value: float
    chosen_by: str


def build_stream(spec: BenchmarkSpec, config: RunConfig, backbone: VisionTransformer, seed: int,
                 task_labels: bool):
    """The benchmark's stream at the backbone's input size and interpolation
    (:func:`~avalanche_color.backbone_data_config`), normalised with the backbone's mean and std or, with
    ``--normalisation imagenet``, ImageNet's, and augmented as ``--augmentation`` says (default: the benchmark's
    own)."""
    data = backbone_data_config(backbone)
    mean, std = ((IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD) if config.normalisation == "imagenet"
                 else (data["mean"], data["std"]))
    return spec.stream(StreamRequest(image_size=data["input_size"][-1], mean=mean, std=std, data=config.data,
                                     seed=seed, task_labels=task_labels, train_per_class=config.train_per_class,
                                     interpolation=data["interpolation"], augmentation=config.augmentation))


def epoch_batches(benchmark: Any, batch_size: int) -> int:
    """Batches of ``batch_size`` in the largest training experience's epoch (what sizes the loader workers)."""
    return max((-(-len(experience.dataset) // batch_size) for experience in benchmark.train_stream), default=1)


def evaluator(loggers: Sequence[BaseLogger] = ()) -> EvaluationPlugin:
    return EvaluationPlugin(
        accuracy_metrics(experience=True, stream=True),
        forgetting_metrics(experience=True, stream=True),
        *routing_accuracy_metrics(),
        loggers=list(loggers),
    )


def avalanche_loggers(names: tuple[str, ...], folder: Path, stack: ExitStack, append: bool = False) -> list:
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


def wandb_logger(config: RunConfig, planned: PlannedRun, options: dict[str, Any], folder: Path):
    """The package's W&B logger for one run (None without ``wandb_project``): the run's config holds
    the method's own options (``options``: rank, k, lr, ...), its seed and the comparison's settings."""
    if config.wandb_project is None:
        return None
    import wandb

    from avalanche_color import WandBLogger

    (folder / "wandb").mkdir(parents=True, exist_ok=True)
    run_config = {"comparison": config_record(config), "method": planned.method, "label": planned.label,
                  "seed": planned.seed, **jsonable(options)}
    return WandBLogger(project_name=config.wandb_project, run_name=f"{config.benchmark} {planned.label} "
                                                                  f"seed {planned.seed}",
                       dir=str(folder / "wandb"), config=run_config, save_code=False,
                       params={"entity": config.wandb_entity, "group": config.benchmark, "job_type": planned.label,
                               "reinit": "create_new",  # one run per (method, seed), even in a notebook
                               # where the run is saved, not its history and summary: those are in the
                               # table the runner prints, and would break up its progress bar per run
                               "settings": wandb.Settings(quiet=True, console="off")})


def method_run(planned: PlannedRun, backbone: VisionTransformer, spec: BenchmarkSpec, config: RunConfig,
               device: str, loggers: Sequence[BaseLogger] = (), num_experiences: Optional[int] = None) -> MethodRun:
    """What ``planned``'s method is built from: the settings, its rank and k, a fresh copy of the
    backbone per call, and the budget and evaluator (with ``loggers``) every method gets alike."""
    return MethodRun(config=config, rank=planned.rank, k=planned.k, num_classes=spec.num_classes,
                     backbone=lambda classes: with_head(copy.deepcopy(backbone), classes),
                     strategy_options=dict(train_mb_size=config.batch_size, train_epochs=config.epochs,
                                           eval_mb_size=EVAL_BATCH, device=device, evaluator=evaluator(loggers)),
                     num_experiences=num_experiences)


def build_method(name: str, config: RunConfig, backbone: Callable[[int], Any], num_classes: int, *,
                 rank: Optional[int] = None, k: Optional[int] = None, device: str = "cpu",
                 loggers: Sequence[BaseLogger] = ()) -> Any:
    """The strategy the runner builds for method ``name`` with ``config``'s settings, ``rank`` and ``k``
    (None: the config's first rank and k, or the benchmark's k, where the method takes them); ``backbone(n)`` gives a
    fresh pretrained ViT with an n-class head (``backbone(0)``: without one)."""
    entry = method(name)
    rank = (rank or config.ranks[0]) if entry.lora else None
    k = (k or (config.ks or (benchmark_spec(config.benchmark).k,))[0]) if entry.prototypes else None
    run = MethodRun(config=config, rank=rank, k=k, num_classes=num_classes, backbone=backbone,
                    strategy_options=dict(train_mb_size=config.batch_size, train_epochs=config.epochs,
                                          eval_mb_size=EVAL_BATCH, device=device, evaluator=evaluator(loggers)))
    strategy = entry.build_strategy(run)
    checked(strategy)
    return strategy


def checked(strategy: Any) -> LearningCheckPlugin:
    """The :class:`~avalanche_color.LearningCheckPlugin` of ``strategy``: its own (the package's strategies add one),
    else one added now (Avalanche's strategies: Naive, EWC, LwF, Replay, JointTraining), so every method the
    runner trains is checked alike for an experience that learned nothing."""
    plugin = next((plugin for plugin in strategy.plugins if isinstance(plugin, LearningCheckPlugin)), None)
    if plugin is None:
        plugin = LearningCheckPlugin()
        strategy.plugins.append(plugin)
    return plugin


class Trained(NamedTuple):
    """A finished run's trained strategy and its record: what a run whose training is the same one follows."""

    strategy: Any
    record: dict[str, Any]


def run_method(planned: PlannedRun, benchmark, spec: BenchmarkSpec, backbone: VisionTransformer, config: RunConfig,
               device: str, attempt: Path, lr: Optional[LearningRate] = None, progress: bool = False,
               follow: Optional[Trained] = None, keep: Optional[Callable[[Trained], None]] = None) -> dict[str, Any]:
    """Trains and evaluates one planned run in the ``attempt`` folder; returns its record. ``lr``: a learning
    rate in place of the method's own (a tuned one); ``progress``: a bar per training experience, with the
    epoch, iteration and ETA (:class:`~avalanche_color.TrainingProgress`).

    ``follow``: the run whose training this one's is (a CoLoR variant's, CoLoR's with the same seed, rank, k and
    lr): its experts are taken, not trained again, and this run's own router evaluates them
    (:func:`~avalanche_color.evaluate_trained_experts`). ``keep``: given the trained strategy and the record once
    the run ends, for the runs that follow it; a run finished before an interruption is then resumed from its
    checkpoint (its record kept as it was), or trained again where it has none."""
    entry = method(planned.method)
    name = f"{slug(planned.label)}_seed{planned.seed}"
    record = run_record_path(attempt, planned)
    finished = json.loads(record.read_text()) if config.resume and record.exists() else None
    if finished is not None and keep is None:  # finished before the interruption
        return finished
    RNGManager.set_random_seeds(planned.seed)
    main_process = DistributedHelper.is_main_process  # True when not distributed
    with ExitStack() as stack:
        # Under torchrun the metrics are gathered on every rank; rank 0 alone logs them. A finished run resumed
        # only to be followed logs nothing again.
        logs = main_process and finished is None
        loggers = avalanche_loggers(config.loggers, attempt / "logs" / name, stack, append=config.resume) if logs else []
        # The method's options depend on the settings, rank and k alone: W&B records them as the run's config.
        options = entry.options(MethodRun(config, planned.rank, planned.k, spec.num_classes, with_head, {},
                                          num_experiences=len(benchmark.train_stream)))
        if lr is not None:
            options = {**options, "lr": lr.value}
        # W&B's files go straight to the output folder (not the attempt), so the run folder W&B prints stays.
        wandb = wandb_logger(config, planned, options, config.output_folder) if logs else None
        if wandb is not None:
            loggers.append(stack.enter_context(wandb))  # finished even if training fails
        strategy = entry.build_strategy(method_run(planned, backbone, spec, config, device, loggers,
                                          num_experiences=len(benchmark.train_stream)), options)
        learning = checked(strategy)  # after each experience: a warning if it learned nothing, recorded below
        if progress:
            strategy.plugins.append(TrainingProgress(f"{planned.label} seed {planned.seed}",
                                                     len(benchmark.train_stream)))
        count = len(benchmark.test_stream)  # the accuracy matrix's columns
        test_sizes = [len(experience.dataset) for experience in benchmark.test_stream]
        wall, cpu = time.perf_counter(), time.process_time()
        # After each experience, evaluated on the experiences seen so far: oracle routing has no
        # expert for a future task, and after the last one this is the whole test stream. A test
        # stream not paired with the training stream (CORe50's one test set) is evaluated whole.
        checkpoint = (ResumePlugin(attempt / "checkpoints" / f"{name}.ckpt", config.checkpoint_epochs)
                      if entry.checkpoint and main_process else None)
        # Every method, Avalanche's strategies too, loads with --workers worker processes.
        workers = config.loader_workers(str(device), epoch_batches(benchmark, config.batch_size))
        loaders = dict(num_workers=workers, persistent_workers=workers > 0)
        evaluate = None if spec.paired_test_stream else evaluate_whole_stream(benchmark, loaders)
        if entry.joint:
            records = [train_jointly(strategy, benchmark, loaders)]
        elif follow is not None:
            records = evaluate_trained_experts(strategy, follow.strategy, benchmark, evaluate=evaluate,
                                               loader_options=loaders)
        else:
            records = train_stream(strategy, benchmark, checkpoint=checkpoint, resume=config.resume,
                                   evaluate=evaluate, loader_options=loaders)
        # A run resumed from a checkpoint: what its earlier attempts spent, so the record gives its whole cost.
        earlier_cpu, earlier_wall = checkpoint.earlier_seconds if checkpoint is not None else (0.0, 0.0)
        # A joint run's matrix is one row (after its one training, every experience): its average
        # accuracy is over the whole test stream, its forgetting 0, and the plot draws it as a level.
        matrix = accuracy_matrix(records, count)
        metrics = records[-1]
        result = {
            "label": planned.label, "method": planned.method, "seed": planned.seed,
            "rank": planned.rank, "k": planned.k,
            "accuracy_matrix": matrix,
            "average_accuracy": weighted_mean(matrix[-1], test_sizes),
            "forgetting": forgetting(matrix),
            # An expert is right for a test sample when it was trained on the training experience
            # the sample's test experience belongs to; where none does, there is nothing to count.
            "routing_accuracy": (weighted_mean(_per_experience(metrics, "RoutingAcc_Exp", count), test_sizes)
                                 if entry.prototypes and spec.paired_test_stream else None),
            "lr": learning_rate(strategy, options),
            "lr_chosen_by": lr.chosen_by if lr is not None else entry.lr_chosen_by or None,
            # Each experience whose training accuracy was no better than chance or whose loss did not fall.
            "learned_nothing": (follow.record["learned_nothing"] if follow is not None
                                else [finding.record() for finding in learning.findings]),
            "trainable_parameters_per_experience": trainable_parameters_per_experience(strategy,
                                                                                       benchmark.train_stream[0]),
            "wall_seconds": earlier_wall + time.perf_counter() - wall,  # a follower's: its evaluation alone
            "cpu_seconds": earlier_cpu + time.process_time() - cpu,
        }
        if follow is not None:
            result["trained_by"] = follow.record["label"]
        if finished is not None:  # resumed only to be followed: the record of its training stands
            result = finished
        elif wandb is not None:
            wandb.run.summary.update({key: value for key, value in result.items()
                                      if isinstance(value, (int, float))})
        if keep is not None:
            keep(Trained(strategy, result))
    if main_process and finished is None:
        write_atomically(record, (json.dumps(result, indent=2) + "\n").encode())
    return result


def run_record_path(attempt: Path, planned: PlannedRun) -> Path:
    """Where ``planned``'s record is written in the ``attempt`` folder once it has finished."""
    return attempt / "runs" / f"{slug(planned.label)}_seed{planned.seed}.json"


def trainable_parameters_per_experience(strategy: Any, first_experience: Optional[Any] = None) -> int:
    """What one experience trains.

    CoLoR and S-Prompts: one expert (LoRA + head, or prompt tokens + head; the first
    experience's, as the paper counts). L2P: everything it trains, the pool's keys and
    prompts and the head over all classes seen; all of it is shared by every experience
    (L2P adds nothing per experience but head rows for new classes). The other methods: what
    they train: the whole model for the fine-tuning baselines, nothing for NCM (0), and for the
    joint bounds what their one training on all experiences trains (Joint-LoRA: one expert
    whose head covers every class). SD-LoRA, InfLoRA, LoRA-Sub and CL-LoRA: what the first experience
    trains (its LoRA component, SD-LoRA's magnitude, the head rows of its classes; CL-LoRA's shared and
    task-specific adapters, block weights and proxy head), as their papers count.
    """
    model = strategy.model
    count = getattr(model, "experience_parameter_count", None)  # the package's models say it themselves
    if count is None:  # Avalanche's strategies and the baselines: what trains
        return sum(p.numel() for p in model.parameters() if p.requires_grad)
    # A model that counts its head rows by the experience's classes refuses None itself, naming num_classes.
    return count(0, None if first_experience is None else len(experience_classes(first_experience)))


def learning_rate(strategy: Any, options: dict[str, Any]) -> Optional[float]:
    """The learning rate the method trained with: its options' or, where they leave it to the strategy, its
    config's (None: nothing trains by gradient)."""
    config = getattr(strategy, "config", None)
    return options.get("lr", getattr(config, "lr", None))


def slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9+=-]+", "_", label).strip("_")


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


def accuracy_matrix(records: Sequence[dict[str, float]], count: int) -> list[list[Optional[float]]]:
    """One row per record of ``train_stream`` (after each training experience): the accuracy on each of
    the ``count`` test experiences, None where not evaluated."""
    return [_per_experience(metrics, "Top1_Acc_Exp", count) for metrics in records]


def _per_experience(metrics: dict[str, float], metric: str, count: int) -> list[Optional[float]]:
    """An Avalanche per-experience metric as a list (None for experiences not evaluated yet)."""
    row: list[Optional[float]] = [None] * count
    for name, value in metrics.items():
        match = PER_EXPERIENCE.match(name)
        if match and match["metric"] == metric:
            row[int(match["experience"])] = value
    return row
