"""What one comparison runs, declared once: every setting with its default, help and check.

:class:`RunConfig` is the single source of the runner's settings. The command line's flags
are made from its fields (:mod:`avalanche_color.runner.cli`): a field ``batch_size`` is the
flag ``--batch-size`` (or the field's ``flag``), its help and default are the field's, and a
tuple field takes several values. A notebook or script builds the same object directly.
Importing this module imports no torch, so ``--help`` and a bad flag answer at once. :func:`config_record`
is the config as results.json, the runs' provenance and W&B record it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any, Optional

from avalanche_color.benchmarks.registry import (BENCHMARKS, OFFLINE_AUGMENTATIONS as AUGMENTATIONS, benchmark_problem,
                                                 benchmark_spec, takers)
from avalanche_color.benchmarks.requests import CALLABLE_FORM
from avalanche_color.color.config import LoRAOptions
from avalanche_color.config import PRECISIONS, PrototypeOptions
from avalanche_color.runner.methods import METHODS, methods_allowed
from avalanche_color.runner.presets import (PRESETS, SHIPPED_BACKBONES, UNTUNED_LRS, preset_settings,
                                            untuned_lrs)
from avalanche_color.utils.checks import (Check, anything, boolean, each, non_negative, non_negative_int, one_of,
                                          open_fraction, optional, path, positive, positive_int, subset_of, text)

LOGGERS = ("text", "csv", "tensorboard")


def registered_methods(values: object) -> Optional[str]:
    """Names of registered methods, checked against the registry as it is now (a method registered
    after import is allowed)."""
    return subset_of(METHODS)(values)
# The images' mean and std: the backbone's own (timm's pretrained_cfg), or ImageNet's, as
# S-Prompts' code normalises (and so the paper's presets, see avalanche_color.runner.presets).
NORMALISATIONS = ("backbone", "imagenet")
DEFAULT_OUT = Path("runs")  # the output folders' parent, in the folder the command runs from
TUNABLE = ("lr",)  # what --tune chooses, for every method alike (avalanche_color.runner.comparison)
MAX_WORKERS = 8  # the most DataLoader workers --workers gives one process by default
BATCHES_PER_WORKER = 4  # --workers' default starts at most one worker per this many batches of an epoch
# torch.set_float32_matmul_precision: "highest" float32 matmuls; "high" TF32 on GPUs that have it (Ampere and
# newer: a 10-bit mantissa in the products, sums in float32); "medium" bfloat16 products.
MATMUL_PRECISIONS = ("highest", "high", "medium")


def default_workers(device: str, cpu_count: Optional[int] = None, processes_per_node: Optional[int] = None,
                    batches: Optional[int] = None) -> int:
    """``--workers``' default for a run on ``device`` whose largest training epoch is ``batches`` batches.

    On a GPU: this machine's CPUs (those the process may use) shared by the processes torchrun starts
    on it (``LOCAL_WORLD_SIZE``), less one kept for each process itself, at most :data:`MAX_WORKERS`
    (a 16-CPU node: 8 with one process, 2 each with four): decoding and augmenting JPEGs in the
    training process would starve the GPU. Every loader starts its workers anew, so a small epoch gets
    at most one per :data:`BATCHES_PER_WORKER` batches (a 10-batch epoch: 3). On the CPU: 0, since the
    model's own threads already use every core, and worker processes would compete with them.
    """
    if not device.startswith("cuda"):
        return 0
    if cpu_count is None:
        cpu_count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if processes_per_node is None:
        processes_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    machine = max(0, min(MAX_WORKERS, cpu_count // max(processes_per_node, 1) - 1))
    return machine if batches is None else min(machine, -(-batches // BATCHES_PER_WORKER))


class RunConfigError(ValueError):
    """A setting of a :class:`RunConfig` that cannot run: which one, its value and what it must be."""

    def __init__(self, field: str, value: object, problem: str) -> None:
        super().__init__(f"{field} {problem}, got {value!r}")
        self.field, self.value, self.problem = field, value, problem


# The comparison's budget: what every method of a run gets alike (the BUDGET group of --help), and why it differs
# from the strategies' own defaults. A strategy's defaults are its paper's (CoLoR: rank 64, 50 epochs at batch 128,
# lr 1e-3 or 0.01 by benchmark: GPU hours per experience of a large stream), which --preset paper takes. The runner
# defaults to a short budget instead, so that a comparison of every method runs on a CPU in minutes on the bundled
# digits: 5 epochs at batch 64, rank 8 (the fields' defaults below), and the learning rates that hold at it, which
# depend on the backbone (presets.UNTUNED_LRS). docs/benchmarks/runner.md ("The runner's budget") says how to
# choose them.
BUDGET = "budget"

def setting(default: Any, help: str, check: Check, *, flag: Optional[str] = None, choices: Any = None,
            cli: bool = True, group: Optional[str] = None, per_method: bool = False, **field_options: Any) -> Any:
    """A :class:`RunConfig` field: its default, help text and check (and, on the command line,
    its flag, its choices, the group of flags it is listed in (``BUDGET``), or ``cli=False`` for a field
    the command line sets itself). ``per_method``: only some methods take it; ``--help`` names them, as the
    method registry finds them (:func:`~avalanche_color.runner.methods.methods_taking`)."""
    metadata = dict(help=help, check=check, flag=flag, choices=choices, cli=cli, group=group, per_method=per_method)
    if isinstance(default, (list, dict, set)):
        raise TypeError("a mutable default would be shared between configs")
    return dataclasses.field(default=default, metadata=metadata, **field_options)


# ---------------------------------------------------------------------- the configuration


@dataclass(frozen=True)
class RunConfig:
    """One comparison: several methods on one benchmark with the same backbone, seeds, epochs and batch.

    Every field is checked on construction (:class:`RunConfigError` names it). ``methods``,
    ``backbone`` and ``ks`` default to the benchmark's; ``out`` to ``runs/<benchmark>``.
    """

    benchmark: str = setting(
        MISSING, f"the stream to run on: one of {', '.join(sorted(BENCHMARKS))}, or {CALLABLE_FORM}, a function "
                 "returning an Avalanche benchmark (image_folder_class, image_folder_domain: your image folders, "
                 "--data DIR; see the runner's docs for both)", benchmark_problem)
    methods: Optional[tuple[str, ...]] = setting(
        None, "the methods to compare (default: every method the benchmark allows; core50: all but CoLoR-oracle)",
        optional(registered_methods), choices=METHODS)
    seeds: tuple[int, ...] = setting((0,), "the seeds of the methods that train a few parameters on the frozen "
                                           "backbone", each(non_negative_int), per_method=True)
    baseline_seeds: Optional[tuple[int, ...]] = setting(
        None, "the seeds of the other methods (default: the first of --seeds)", optional(each(non_negative_int)),
        per_method=True)
    preset: Optional[str] = setting(
        None, "named settings for the benchmark (paper: the paper's rank, k, batch, epochs, lr, weight decay, "
              "backbone and normalisation); flags given override it", optional(one_of(PRESETS)),
        choices=sorted(PRESETS))
    epochs: int = setting(5, "training epochs per experience of every method", positive_int, group=BUDGET)
    batch_size: int = setting(64, "training batch size of every method (under torchrun: per process)", positive_int,
                              group=BUDGET)
    backbone: Optional[str] = setting(
        None, "a pretrained timm name (from the Hugging Face cache or hub), a weights file (a file save_backbone "
              "wrote, or a timm state dict .pth/.pt/.bin/.safetensors with --architecture), 'random:<timm name>' "
              "for random weights, 'offline' or 'digits' (default: the benchmark's)", optional(text))
    architecture: Optional[str] = setting(
        None, "the timm model name that builds a state dict given as --backbone FILE, e.g. "
              "vit_base_patch16_224.augreg_in21k", optional(text))
    image_size: Optional[int] = setting(
        None, "the backbone's input side in px: a timm ViT's position embedding is resampled to it and the images "
              "resized to it with the backbone's interpolation (default: the backbone's own input size)",
        optional(positive_int))
    data: Optional[Path] = setting(None, "the data set's zip file or folder (default: the benchmark's; the digits "
                                         "take none; the image folders' tree; a function: given as its data "
                                         "keyword)", optional(path))
    experiences: Optional[int] = setting(
        None, "the number of experiences image_folder_class splits its classes into, consecutive in the order of "
              "their names (default: 2 classes each)", optional(positive_int))
    ranks: tuple[int, ...] = setting((8,), f"{LoRAOptions.doc('rank')} Several: an ablation",
                                     each(positive_int), flag="--rank", per_method=True)
    ks: Optional[tuple[int, ...]] = setting(
        None, f"{PrototypeOptions.doc('k')} Default: the paper's rule; several: an ablation",
        optional(each(positive_int)), flag="--k", per_method=True)
    prototypes_per_class: Optional[int] = setting(
        None, f"{PrototypeOptions.doc('prototypes_per_class')} Default: off",
        optional(positive_int), per_method=True)
    augmentation: Optional[str] = setting(
        None, "the training augmentation: light (resize, pad-and-crop, flip: the offline streams' own, for their "
              "small images) or paper (the paper's, S-Prompts' RandomResizedCrop and flip, evaluated after Resize "
              "and CenterCrop: the paper's streams' only one); default: the benchmark's own; --preset paper: paper",
        optional(one_of(AUGMENTATIONS)), choices=AUGMENTATIONS)
    normalisation: str = setting("backbone", "the images' mean and std: the backbone's own or ImageNet's "
                                             "(--preset paper: ImageNet's, as S-Prompts' code)",
                                 one_of(NORMALISATIONS), choices=NORMALISATIONS)
    ridge_width: int = setting(2048, "random features M of RanPAC and the ridge routers", positive_int,
                                   per_method=True)
    color_lr: Optional[float] = setting(
        None, "lr of the methods that train as CoLoR (SGD, cosine per experience); default: "
              f"{UNTUNED_LRS['shipped']['color_lr']} on the package's backbones ({', '.join(SHIPPED_BACKBONES)}), "
              f"{UNTUNED_LRS['pretrained']['color_lr']} on any other", optional(positive),
        group=BUDGET, per_method=True)
    baseline_lr: Optional[float] = setting(
        None, f"lr of the fine-tuning baselines (SGD); default: {UNTUNED_LRS['shipped']['baseline_lr']} on the "
              f"package's backbones, {UNTUNED_LRS['pretrained']['baseline_lr']} on any other", optional(positive),
        group=BUDGET, per_method=True)
    weight_decay: Optional[float] = setting(
        None, "weight decay of the optimiser (default: each method's own: CoLoR 2e-4, fine-tuning 0)",
        optional(non_negative), per_method=True)
    train_per_class: Optional[int] = setting(
        None, f"keep at most this many training images of each class (in each domain of a domain-incremental "
              f"stream) ({', '.join(takers('subsample'))})", optional(positive_int))
    device: str = setting("auto", "cpu, cuda, cuda:N or auto (cuda where there is one)", text)
    precision: str = setting(
        "32-true", "float32, or each forward and loss under bfloat16/float16 autocast with float32 trained "
                   "weights; the methods that do not take it run in float32", one_of(PRECISIONS),
        choices=PRECISIONS, per_method=True)
    matmul_precision: str = setting(
        "highest", "torch.set_float32_matmul_precision for the run: highest (float32 matmuls), high (TF32 on "
                   "Ampere and newer GPUs), medium (bfloat16 products); recorded in the results",
        one_of(MATMUL_PRECISIONS), choices=MATMUL_PRECISIONS)
    workers: Optional[int] = setting(
        None, f"DataLoader worker processes of every method (0: loading in this process; default: on a GPU this "
              f"machine's CPUs less one, divided among torchrun's processes on a node, at most {MAX_WORKERS} and "
              f"one per {BATCHES_PER_WORKER} batches of the largest training epoch: {default_workers('cuda')} here "
              f"for a large epoch; on the CPU 0, as the model's threads use every core)",
        optional(non_negative_int))
    out: Optional[Path] = setting(None, "the output folder", optional(path), cli=False)
    loggers: tuple[str, ...] = setting(LOGGERS, "Avalanche's loggers of each run, under <output>/logs/",
                                       subset_of(LOGGERS, allow_empty=True), choices=LOGGERS)
    wandb_project: Optional[str] = setting(None, "log every run to this W&B project", optional(text))
    wandb_entity: Optional[str] = setting(None, "the W&B entity (team or user) of --wandb-project", optional(text))
    tune: Optional[str] = setting(
        None, "choose each method's learning rate from --lr-grid by its average accuracy on a validation split "
              "held out from the training experiences (seed 0, the same split for every method), then run "
              "every seed with it (default: each method's own lr, see the results' lr_chosen_by)",
        optional(one_of(TUNABLE)), choices=TUNABLE)
    lr_grid: tuple[float, ...] = setting((1e-3, 3e-3, 1e-2, 3e-2, 1e-1), "the learning rates --tune lr tries, the "
                                                                         "same for every method", each(positive))
    lr_from: tuple[Path, ...] = setting(
        (), "take each method's learning rate from the --tune lr choices of these finished comparisons (their "
            "folders, or results.json files): the rule's choice at their budget, carried to this one; a CoLoR "
            "variant tuned in none takes CoLoR's (its experts train as CoLoR's); the others keep their own",
        each(path, allow_empty=True))
    held_out: float = setting(0.1, "the fraction of each class of each training experience --tune holds out for "
                                    "validation", open_fraction)
    resume: bool = setting(False, "continue an interrupted comparison in the same folder from its checkpoints",
                           boolean)
    checkpoint_epochs: Optional[int] = setting(
        None, "also checkpoint every this many epochs (default: after each experience only; the "
              "other methods save no checkpoint)", optional(positive_int), per_method=True)
    command: str = setting("", "the command that made the config, for the results", anything, cli=False,
                           compare=False)
    preset_settings: Optional[dict[str, Any]] = setting(None, "the preset's values", anything, cli=False,
                                                        init=False, compare=False)

    @classmethod
    def from_preset(cls, preset: Optional[str], **settings: Any) -> "RunConfig":
        """The preset's settings for ``settings["benchmark"]``, with ``settings`` over them."""
        if preset is None:
            return cls(**settings)
        if preset not in PRESETS:
            raise RunConfigError("preset", preset, f"must be one of {sorted(PRESETS)}")
        benchmark = settings.get("benchmark")
        if benchmark not in PRESETS[preset]:
            raise RunConfigError("preset", preset, f"has no settings for benchmark {benchmark!r}: it has them for "
                                                   f"{sorted(PRESETS[preset])}")
        return cls(**{**preset_settings(preset, benchmark), **settings, "preset": preset})

    def __post_init__(self) -> None:
        for name in ("data", "out"):  # paths may come as strings (notebooks, JSON configs)
            if isinstance(getattr(self, name), str):
                object.__setattr__(self, name, Path(getattr(self, name)))
        for name in ("methods", "seeds", "baseline_seeds", "ranks", "ks", "loggers", "lr_grid", "lr_from"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if any(isinstance(folder, str) for folder in self.lr_from):
            object.__setattr__(self, "lr_from", tuple(Path(folder) for folder in self.lr_from))
        for spec in dataclasses.fields(self):
            problem = spec.metadata["check"](getattr(self, spec.name))
            if problem:
                raise RunConfigError(spec.name, getattr(self, spec.name), problem)
        spec = benchmark_spec(self.benchmark)
        allowed = methods_allowed(spec)
        if self.methods is None:
            object.__setattr__(self, "methods", allowed)
        refused = [method for method in self.methods if method not in allowed]
        if refused:
            raise RunConfigError("methods", self.methods,
                                 f"cannot hold {refused} on benchmark {self.benchmark!r}: its test experiences "
                                 "belong to no training experience (core50: one test set of held-out sessions), "
                                 f"so there is no task label to route by; must be among {list(allowed)}")
        problem = spec.augmentation_problem(self.augmentation)
        if problem:
            raise RunConfigError("augmentation", self.augmentation, problem)
        for name in ("train_per_class", "experiences"):
            problem = spec.setting_problem(name, getattr(self, name))
            if problem:
                raise RunConfigError(name, getattr(self, name), problem)
        if self.lr_from and self.tune is not None:
            raise RunConfigError("lr_from", self.lr_from, "cannot be given with --tune lr, which chooses the "
                                                          "learning rates itself: give one of the two")
        if self.preset is not None:
            object.__setattr__(self, "preset_settings", preset_settings(self.preset, self.benchmark))
        for name, lr in untuned_lrs(self.backbone or spec.backbone).items():  # recorded as the run used them
            if getattr(self, name) is None:
                object.__setattr__(self, name, lr)

    def loader_workers(self, device: str, batches: Optional[int] = None) -> int:
        """``workers``, or its default for ``device`` and an epoch of ``batches`` batches (:func:`default_workers`)."""
        return default_workers(device, batches=batches) if self.workers is None else self.workers

    @property
    def output_folder(self) -> Path:
        """Where the comparison writes: ``out``, or ``runs/<benchmark>``."""
        return self.out or DEFAULT_OUT / folder_name(self.benchmark)


def folder_name(benchmark: str) -> str:
    """The output folder's default name for ``benchmark``: its name (a function's ``module:function`` with ``_``
    for the colon, which not every file system takes)."""
    return benchmark.replace(":", "_")


# ---------------------------------------------------------------------- the configuration as results record it


def config_record(config: RunConfig) -> dict[str, Any]:
    """The config as JSON; a path inside the folder the command runs from relative to it, so no
    machine's folders show."""
    return jsonable({name: relative(value) if isinstance(value, Path) else value
                     for name, value in dataclasses.asdict(config).items()})


def relative(path: Path) -> Path:
    try:
        return path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return path


def jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return str(value) if isinstance(value, Path) else value
