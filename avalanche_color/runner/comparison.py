"""A comparison from start to end: the runs it makes (:func:`plan_runs`), everything checked and the streams
built first (:func:`prepare`), then, with ``--tune lr``, each method's learning rate chosen, then every planned
run in an attempt folder, and the results written when all have finished.

One tuning rule for every method: each method's learning rate chosen from one grid on one validation split.
With ``--tune lr`` a comparison first runs every method that trains by gradient once per value of
``--lr-grid`` on a validation benchmark (:func:`~avalanche_color.benchmarks.stream_building.validation_benchmark`:
``--held-out`` of each training experience's classes, seed 0, the same split for every method),
at the comparison's budget, rank and k, and keeps the value with the best average accuracy
after the last experience (ties: the smaller lr). Every seed of the comparison then runs with
it, and results.json records the rule, the grid, each trial and each choice. The trials live in
the attempt folder's ``tuning/``, so ``--resume`` keeps those that finished.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Optional

import torch
from avalanche.distributed import DistributedHelper
from tqdm import tqdm

from avalanche_color import write_atomically
from avalanche_color.backbones import backbone_data_config
from avalanche_color.benchmarks.registry import BENCHMARKS, BenchmarkSpec, benchmark_spec, check_data, measured_spec
from avalanche_color.benchmarks.requests import SettingError
from avalanche_color.benchmarks.stream_building import validation_benchmark
from avalanche_color.runner.backbone_loading import input_size_problem, load_backbone, resize_input, weights_file
from avalanche_color.runner.config import RunConfig, RunConfigError, config_record
from avalanche_color.runner.methods import REGISTRY, method
from avalanche_color.runner.provenance import (check_folder, code_commit, complete_attempt, describe_machine,
                                               provenance, start_attempt)
from avalanche_color.runner.report import markdown_table, summary_rows, write_results
from avalanche_color.runner.run import (LearningRate, PlannedRun, Trained, build_stream, epoch_batches, run_method,
                                       run_record_path, slug)


# ---------------------------------------------------------------------- the plan


def check_distributed(config: RunConfig) -> None:
    """Refuses what does not run on several processes."""
    allowed = [name for name, entry in REGISTRY.items() if entry.distributed]
    unsupported = [name for name in config.methods if not method(name).distributed]
    if unsupported:
        raise RunConfigError("methods", config.methods, f"cannot hold {unsupported} under torchrun: with several "
                                                        f"processes they must be among {allowed}")
    if config.tune is not None:
        raise RunConfigError("tune", config.tune, "is not supported under torchrun: run the tuned comparison in one "
                                                  "process")
    if config.resume:
        raise RunConfigError("resume", True, "is not supported under torchrun: run the interrupted comparison in "
                                             "one process")


def plan_runs(config: RunConfig, spec: BenchmarkSpec) -> list[PlannedRun]:
    """Every run, in order: per method, each rank (methods with LoRA) x each k (prototype-routed
    methods) x each seed (``seeds`` for the frozen-backbone methods, else ``baseline_seeds``).
    A label names the variant where the method's ranks or ks are ablated."""
    ks = config.ks or (spec.k,)
    plan = []
    for name in config.methods:
        entry = method(name)
        ranks = config.ranks if entry.lora else (None,)
        method_ks = ks if entry.prototypes else (None,)
        ablating = len(ranks) > 1 or len(method_ks) > 1
        seeds = config.seeds if entry.frozen_backbone else config.baseline_seeds or config.seeds[:1]
        for rank in ranks:
            for k in method_ks:
                variant = [f"{axis}={value}" for axis, value in (("r", rank), ("k", k)) if ablating and value]
                label = " ".join([name, *variant])
                plan += [PlannedRun(name, label, seed, rank, k) for seed in seeds]
    return plan


# ---------------------------------------------------------------------- checked and ready


@dataclass
class Prepared:
    """A comparison checked and ready: nothing has been written yet."""

    spec: BenchmarkSpec
    device: str
    backbone: Any
    plan: list[PlannedRun]
    streams: dict[tuple[int, bool], Any]
    record: dict[str, Any]
    backbone_source: dict[str, Any]
    carried: dict[str, LearningRate]  # --lr-from's learning rates, by method


def prepare(config: RunConfig) -> Prepared:
    """Checks everything a comparison needs, the output folder, the learning rates ``--lr-from`` carries, the
    backbone, the data, the streams' images against the backbone's input and each run's k, and builds its
    streams; refuses (:class:`RunConfigError`) before anything is written."""
    spec = benchmark_spec(config.benchmark).configured(experiences=config.experiences)
    if DistributedHelper.is_main_process:
        problem = output_problem(config.output_folder)
        if problem:
            raise RunConfigError("out", config.output_folder, problem)
    carried = carried_learning_rates(config)
    if DistributedHelper.is_distributed:
        check_distributed(config)
        device = str(DistributedHelper.make_device())  # each rank's own: cuda:<LOCAL_RANK> (init_distributed) or cpu
    else:
        device = config.device if config.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        check_data(config.benchmark, config.data)
    except ValueError as error:
        raise RunConfigError("data", config.data, str(error)) from None
    backbone_name = config.backbone or spec.backbone
    try:
        backbone = load_backbone(backbone_name, architecture=config.architecture)
    except (ValueError, TypeError, FileNotFoundError) as error:
        raise RunConfigError("backbone", backbone_name, str(error)) from error
    if config.image_size is not None:
        problem = input_size_problem(backbone, config.image_size, backbone_name)
        if problem:
            raise RunConfigError("image_size", config.image_size, problem)
        resize_input(backbone, config.image_size, backbone_name)
    plan = plan_runs(config, spec)
    streams: dict[tuple[int, bool], Any] = {}
    for planned in plan:
        key = (planned.seed, method(planned.method).task_labels)
        if key not in streams:
            streams[key] = checked_stream(spec, config, backbone, backbone_name, *key)
            spec = measured_spec(spec, streams[key])  # a user's data: its classes, k and pairing
            check_pairing(config, spec)
        check_prototypes(config, planned, streams[key])
    record = provenance(config, backbone, device)
    if DistributedHelper.is_main_process:
        check_folder(config.output_folder, record, config.resume)
    return Prepared(spec, device, backbone, plan, streams, record, backbone_source(backbone_name, config, backbone),
                    carried)


def output_problem(out: Path) -> Optional[str]:
    """What keeps the comparison from writing ``out`` (None: nothing): a file where a folder of its path must be,
    or a folder it would go in that cannot be written (tried with an empty folder made and removed at once)."""
    if "\0" in str(out):
        return "is not a folder this system can make (a name with a NUL byte): give --out-dir another folder"
    existing = out
    while not _exists(existing) and existing != existing.parent:
        existing = existing.parent
    if existing.is_dir():
        longest = max((len(os.fsencode(part)) for part in out.relative_to(existing).parts), default=0)
        limit = os.pathconf(existing, "PC_NAME_MAX") if hasattr(os, "pathconf") else 255
        if longest > limit:
            return (f"is not a folder this system can make (a name of {longest} bytes, where {limit} at most fit): "
                    "give --out-dir another folder")
    if existing == out and existing.is_file():
        return None  # the output folder itself is a file: check_folder asks for another --name
    if not existing.is_dir():
        return f"cannot be made: {str(existing)!r} is a file, not a folder; give --out-dir a folder"
    try:
        Path(tempfile.mkdtemp(prefix=".avalanche-color-", dir=existing)).rmdir()
    except OSError as error:
        return (f"cannot be written: {str(existing)!r} does not let a folder be made in it "
                f"({error.strerror or type(error).__name__}); give --out-dir a folder you can write to")
    return None


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name too long to look up
        return False


def checked_stream(spec: BenchmarkSpec, config: RunConfig, backbone: Any, backbone_name: str, seed: int,
                   task_labels: bool) -> Any:
    """The stream :func:`~avalanche_color.runner.run.build_stream` builds, refused (:class:`RunConfigError` naming
    the setting) where it cannot be built or its images are not the backbone's input."""
    own = config.benchmark in BENCHMARKS  # else a user's function: what goes wrong is its
    try:
        stream = build_stream(spec, config, backbone, seed, task_labels)
    except SettingError as error:
        value = getattr(config, error.setting)
        if error.setting == "methods":
            routed = [name for name in config.methods if method(name).task_labels]
            raise RunConfigError("methods", tuple(routed), f"{error}: leave {', '.join(routed)} out of --methods, or "
                                                           "give the function that keyword") from error
        raise RunConfigError(error.setting, value, str(error)) from error
    except (OSError, ValueError) as error:  # missing, empty, damaged or foreign data
        raise (RunConfigError("data", config.data, str(error)) if own or config.data is not None else
               RunConfigError("benchmark", config.benchmark, f"could not be built: {type(error).__name__}: {error}")
               ) from error
    problem = input_problem(stream, backbone)
    if problem:
        raise (RunConfigError("backbone", backbone_name, problem) if own else
               RunConfigError("benchmark", config.benchmark, f"{problem}: build the images at the image_size "
                                                             "keyword the runner passes (with mean and std), or "
                                                             "pass --image-size for a backbone at their size"))
    return stream


def input_problem(stream: Any, backbone: Any) -> Optional[str]:
    """What is wrong with ``stream``'s images as ``backbone``'s input (None: nothing): the first image of its
    first training and test experience must have the backbone's input shape (channels, height, width)."""
    expected = tuple(backbone_data_config(backbone)["input_size"])
    for name in ("train_stream", "test_stream"):
        image = getattr(stream, name)[0].dataset[0][0]
        shape = tuple(getattr(image, "shape", ()))
        if shape != expected:
            return (f"gives images of shape {shape or type(image).__name__} in its {name}, but the backbone takes "
                    f"{expected}")
    return None


def check_pairing(config: RunConfig, spec: BenchmarkSpec) -> None:
    """Refuses the methods that route by task label on a stream whose test experiences belong to no training
    experience (a user's function whose streams differ in length)."""
    routed = [name for name in config.methods if method(name).task_labels]
    if routed and not spec.paired_test_stream:
        raise RunConfigError("methods", tuple(routed), f"cannot run on {spec.name}: its test stream is not one "
                                                       "experience per training experience, so there is no task "
                                                       f"label to route by; leave {', '.join(routed)} out")


def backbone_source(name: str, config: RunConfig, backbone: Any) -> dict[str, Any]:
    """What the results say of the backbone: the spec it was loaded from (a file's name and SHA-256, not its
    folder), its timm architecture and the preprocessing its streams were made with."""
    data = backbone_data_config(backbone)
    source: dict[str, Any] = {"spec": name, "architecture": config.architecture,
                              "input_size": list(data["input_size"]), "interpolation": data["interpolation"],
                              "mean": list(data["mean"]), "std": list(data["std"])}
    path = weights_file(name)
    if path is not None:
        source["spec"] = path.name
        source["file_sha256"] = file_sha256(path)
    return source


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_prototypes(config: RunConfig, planned: PlannedRun, stream: Any) -> None:
    """Refuses a k (or prototypes per class) larger than an experience (or one of its classes) can give."""
    if planned.k is None:
        return
    for index, experience in enumerate(stream.train_stream):
        if config.prototypes_per_class is None:
            field, value, available = "ks", planned.k, len(experience.dataset)
            what = f"training experience {index} of {config.benchmark} has {available} samples"
        else:
            counts = torch.as_tensor(list(experience.dataset.targets)).unique(return_counts=True)[1]
            field, value, available = "prototypes_per_class", config.prototypes_per_class, int(counts.min())
            what = f"a class of training experience {index} of {config.benchmark} has {available} samples"
        if value > available:
            raise RunConfigError(field, value, f"must be at most {available}: {what} to fit {planned.method}'s "
                                               "k-means centres on")


# ---------------------------------------------------------------------- --tune lr

TUNING_SEED = 0
RULE = ("the grid's lr with the best average accuracy after the last experience on a validation split held out "
        "from the training experiences (seed 0, the same split for every method); ties: the smaller lr")


class Choice(NamedTuple):
    """A method's tuned learning rate, its validation accuracy, and every trial's (lr -> accuracy)."""

    lr: float
    validation_accuracy: float
    trials: dict[float, float]


def tunable(names: tuple[str, ...]) -> list[str]:
    """The methods among ``names`` that train by gradient (the others have no lr to choose)."""
    return [name for name in names if method(name).lr_chosen_by]


def tune_learning_rates(config: RunConfig, ready: Prepared, attempt: Path, progress: bool = True) -> dict[str, Choice]:
    """Each tunable method's :class:`Choice` (``ready``: the prepared comparison)."""
    names = tunable(config.methods or ())
    trial_config = dataclasses.replace(config, loggers=(), wandb_project=None)  # trials log nothing
    benchmarks: dict[bool, Any] = {}
    choices = {}
    with tqdm(total=len(names) * len(config.lr_grid), desc=f"{config.benchmark}: tuning lr", unit="run",
              disable=not progress) as bar:
        for name in names:
            entry = method(name)
            if entry.task_labels not in benchmarks:
                stream = ready.streams.get((TUNING_SEED, entry.task_labels)) or build_stream(
                    ready.spec, config, ready.backbone, TUNING_SEED, entry.task_labels)
                benchmarks[entry.task_labels] = validation_benchmark(stream, config.held_out, seed=TUNING_SEED)
            rank = config.ranks[0] if entry.lora else None
            k = (config.ks or (ready.spec.k,))[0] if entry.prototypes else None
            trials = {}
            for lr in config.lr_grid:
                bar.set_postfix_str(f"{name}, lr {lr:g}")
                planned = PlannedRun(name, f"{name} lr={lr:g}", TUNING_SEED, rank, k)
                trials[lr] = trial(planned, benchmarks[entry.task_labels], ready, trial_config, attempt / "tuning",
                                   lr)
                bar.update()
            best = best_lr(trials)
            if best is None:
                raise FloatingPointError(f"every lr of --lr-grid {list(config.lr_grid)} diverged for {name} (a "
                                         f"non-finite loss): give smaller values")
            choices[name] = Choice(best, trials[best], trials)
    return choices


def best_lr(trials: dict[float, float | None]) -> float | None:
    """The rule's choice among a method's trials (lr -> validation accuracy, None: diverged): the best
    accuracy, ties to the smaller lr; None where every trial diverged."""
    finished = [lr for lr, accuracy in trials.items() if accuracy is not None]
    return max(finished, key=lambda lr: (trials[lr], -lr)) if finished else None


def trial(planned: PlannedRun, benchmark: Any, ready: Prepared, config: RunConfig, folder: Path,
          lr: float) -> float | None:
    """One trial's validation accuracy, or None where training at ``lr`` diverged (a non-finite loss, which the
    package's strategies refuse before the step): that lr loses, and the grid goes on. A diverged trial's record
    says so, so that ``--resume`` does not run it again."""
    try:
        record = run_method(planned, benchmark, ready.spec, ready.backbone, config, ready.device, folder,
                            lr=LearningRate(lr, "a --tune lr trial"))
    except FloatingPointError as error:
        name = f"{slug(planned.label)}_seed{planned.seed}"
        record = {"label": planned.label, "method": planned.method, "seed": planned.seed, "lr": lr,
                  "diverged": str(error), "average_accuracy": None}
        (folder / "runs").mkdir(parents=True, exist_ok=True)
        write_atomically(folder / "runs" / f"{name}.json", (json.dumps(record, indent=2) + "\n").encode())
        (folder / "checkpoints" / f"{name}.ckpt").unlink(missing_ok=True)
    return record["average_accuracy"]


def tuning_record(config: RunConfig, choices: dict[str, Choice]) -> dict[str, Any]:
    """What results.json says of the tuning: the rule, grid, split and each method's trials and choice."""
    return {"tuned": config.tune, "rule": RULE, "grid": list(config.lr_grid), "held_out": config.held_out,
            "seed": TUNING_SEED,
            "choices": {name: {"lr": choice.lr, "validation_accuracy": choice.validation_accuracy,
                               "trials": {f"{lr:g}": accuracy for lr, accuracy in choice.trials.items()}}
                        for name, choice in choices.items()}}


def chosen(choices: dict[str, Choice], name: str) -> LearningRate | None:
    """The learning rate method ``name`` runs with after tuning (None: its own)."""
    if name not in choices:
        return None
    return LearningRate(choices[name].lr, f"--tune lr: {RULE}")


# ---------------------------------------------------------------------- --lr-from: a tuned choice carried


def followed_runs(plan: list[PlannedRun], lrs: dict[PlannedRun, Optional[LearningRate]]) -> dict[PlannedRun, PlannedRun]:
    """Each planned run whose training is another planned run's, and that run: a method that trains as another
    (``Method.trains_as``: a CoLoR variant, which differs from CoLoR in how it routes alone) and that method with
    the same seed, rank, k and learning rate. The follower takes its experts and evaluates them under its own
    router, the same records as training them again (tests/test_shared_experts.py), at the cost of an
    evaluation. Under torchrun every run trains on its own."""
    if DistributedHelper.is_distributed:
        return {}
    runs = {(planned.method, planned.seed, planned.rank, planned.k): planned for planned in plan}
    follows = {}
    for planned in plan:
        source = runs.get((method(planned.method).trains_as, planned.seed, planned.rank, planned.k))
        if source is not None and _value(lrs[planned]) == _value(lrs[source]):
            follows[planned] = source
    return follows


def _value(lr: Optional[LearningRate]) -> Optional[float]:
    return None if lr is None else lr.value


def run_order(plan: list[PlannedRun], follows: dict[PlannedRun, PlannedRun]) -> list[PlannedRun]:
    """The plan's runs in the order they run: each followed run, then at once the runs that follow it (so one
    trained model at a time is held); the results keep the plan's order."""
    order = []
    for planned in plan:
        if planned not in follows:
            order += [planned, *(run for run in plan if follows.get(run) == planned)]
    return order


def carried_learning_rates(config: RunConfig) -> dict[str, LearningRate]:
    """The learning rate each method of ``config`` takes from ``--lr-from``'s comparisons: the choice of the
    first of them that tuned it, or, for a method that trains as another (a CoLoR variant), that method's.
    Refuses a folder that holds no finished comparison, or one that was not tuned."""
    tuned: dict[str, tuple[float, str]] = {}
    for source in config.lr_from:
        results = source / "results.json" if source.is_dir() else source
        if not results.is_file():
            raise RunConfigError("lr_from", source, "must be a finished comparison's folder or results.json: "
                                                    f"{str(results)!r} does not exist")
        try:
            record = json.loads(results.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise RunConfigError("lr_from", source, f"must be a comparison's results.json: {error}") from None
        tuning = record.get("tuning") if isinstance(record, dict) else None
        if not tuning:
            raise RunConfigError("lr_from", source, "must be a comparison run with --tune lr: its results hold "
                                                    "no tuning")
        settings = record.get("config", {})
        for name, choice in tuning["choices"].items():
            budget = _budget(settings, with_rank=name in REGISTRY and method(name).lora)
            tuned.setdefault(name, (choice["lr"], f"--lr-from {results.parent.name} ({budget})"))
    carried = {}
    for name in tunable(config.methods or ()):
        source = name if name in tuned else method(name).trains_as
        if source in tuned:
            lr, where = tuned[source]
            whose = "" if source == name else f"{source}'s choice (its training is {source}'s); "
            carried[name] = LearningRate(lr, f"{where}: {whose}{RULE}")
    return carried


def _budget(settings: dict[str, Any], with_rank: bool) -> str:
    """A tuned comparison's budget in a few words: epochs, batch, training images and, for a method that takes
    one (``with_rank``), its rank."""
    data = settings.get("train_per_class")
    images = "all training images" if data is None else f"{data} training images per class"
    ranks = settings.get("ranks") or ["?"]
    rank = f", rank {ranks[0]}" if with_rank else ""
    return f"{settings.get('epochs')} epochs, batch {settings.get('batch_size')}, {images}{rank}"


# ---------------------------------------------------------------------- the runs and results


def run_comparison(config: RunConfig, progress: bool = True) -> dict[str, Any]:
    """Runs every (method, variant, seed) of ``config``, writes the results, and returns them."""
    ready = prepare(config)
    matmul = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(config.matmul_precision)  # TF32 or not, for this comparison only
    try:
        return compare(config, ready, progress)
    finally:
        torch.set_float32_matmul_precision(matmul)


def compare(config: RunConfig, ready: Prepared, progress: bool) -> dict[str, Any]:
    main_process = DistributedHelper.is_main_process  # True when not distributed
    out = config.output_folder
    attempt = start_attempt(out, ready.record, config.resume) if main_process else out / "attempt"
    choices = (tune_learning_rates(config, ready, attempt, progress and main_process)
               if config.tune is not None else {})
    lrs = {planned: chosen(choices, planned.method) or ready.carried.get(planned.method) for planned in ready.plan}
    follows = followed_runs(ready.plan, lrs)
    trained: dict[PlannedRun, Trained] = {}  # the run whose followers run next, while they do
    records: dict[PlannedRun, dict[str, Any]] = {}
    with tqdm(total=len(ready.plan), desc=f"{config.benchmark}: runs", unit="run",
              disable=not (progress and main_process)) as bar:
        for planned in run_order(ready.plan, follows):
            bar.set_postfix_str(f"{planned.label}, seed {planned.seed}")
            stream = ready.streams[(planned.seed, method(planned.method).task_labels)]
            followers = [run for run, source in follows.items() if source == planned
                         and not (config.resume and run_record_path(attempt, run).exists())]
            if planned not in follows:
                trained.clear()
            records[planned] = run_method(
                planned, stream, ready.spec, ready.backbone, config, ready.device, attempt, lr=lrs[planned],
                progress=progress and main_process, follow=trained.get(follows.get(planned)),
                keep=(lambda run, key=planned: trained.__setitem__(key, run)) if followers else None)
            bar.update()
    trained.clear()
    runs = [records[planned] for planned in ready.plan]

    # The workers used (--workers' default depends on the device), so a results file says what ran.
    batches = max(epoch_batches(stream, config.batch_size) for stream in ready.streams.values())
    used = dataclasses.replace(config, workers=config.loader_workers(ready.device, batches))
    result = {"config": config_record(used), "device": describe_machine(ready.device),
              "backbone": ready.record["backbone"], "backbone_source": ready.backbone_source,
              "code": ready.record["code"], "commit": code_commit(), "runs": runs}
    if config.tune is not None:
        result["tuning"] = tuning_record(config, choices)
    if DistributedHelper.is_distributed:
        result["world_size"] = DistributedHelper.world_size
    if not main_process:  # every rank holds the same results; rank 0 writes them
        result["table"] = markdown_table(summary_rows(runs))
        return result
    complete_attempt(out, attempt)
    result["table"] = write_results(result, config, ready.spec, out)
    return result
