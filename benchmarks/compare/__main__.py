"""``python -m benchmarks.compare``: the comparison runner's command line (see :mod:`benchmarks.compare.runner`)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import warnings
from pathlib import Path
from typing import Any, Optional

import torch
from avalanche.distributed import DistributedHelper

from avalanche_color.training.distributed import is_distributed
from benchmarks.backbones import BackboneUnavailable
from benchmarks.compare import runner
from benchmarks.compare.config import LOGGERS, NORMALISATIONS, RESULTS, SCRATCH, ComparisonConfig
from benchmarks.compare.methods import METHODS
from benchmarks.compare.presets import PAPER, PRESETS
from benchmarks.compare.runner import run_comparison
from benchmarks.streams.registry import BENCHMARKS


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=runner.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--benchmark", required=True, choices=sorted(BENCHMARKS))
    parser.add_argument("--methods", nargs="+", choices=METHODS,
                        help="default: every method the benchmark allows (core50: all but CoLoR-oracle)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--baseline-seeds", nargs="+", type=int, help="default: the first of --seeds")
    parser.add_argument("--preset", choices=sorted(PRESETS),
                        help="named settings for the benchmark (paper: the paper's rank, k, batch, epochs, lr, "
                             f"weight decay, backbone and normalisation, for {', '.join(sorted(PAPER))}); "
                             "flags given override it")
    parser.add_argument("--epochs", type=int, help=f"default: {ComparisonConfig.epochs}")
    parser.add_argument("--batch-size", type=int, help=f"default: {ComparisonConfig.batch_size}")
    parser.add_argument("--backbone",
                        help="a pretrained timm name (from the Hugging Face cache or hub), a weights file (a file "
                             "save_backbone wrote, or a timm state dict .pth/.pt/.bin/.safetensors with "
                             "--architecture), 'random:<timm name>' for random weights, 'offline' or 'digits' "
                             "(default: the benchmark's)")
    parser.add_argument("--architecture",
                        help="the timm model name that builds a state dict given as --backbone FILE, "
                             "e.g. vit_base_patch16_224.augreg_in21k")
    parser.add_argument("--data", type=Path, help="the data set's zip or folder (default: the benchmark's)")
    parser.add_argument("--rank", nargs="+", type=int, help=f"default: {ComparisonConfig.ranks[0]}")
    parser.add_argument("--k", nargs="+", type=int, help="prototypes per experience (default: the paper's rule)")
    parser.add_argument("--prototypes-per-class", type=int,
                        help="beyond the paper: k-means centres per class instead of k per experience "
                             "(CoLoR family, S-Prompts; default: off)")
    parser.add_argument("--normalisation", choices=NORMALISATIONS,
                        help="the images' mean and std: the backbone's own or ImageNet's (default: the backbone's; "
                             "--preset paper: ImageNet's, as S-Prompts' code)")
    parser.add_argument("--ridge-width", type=int, default=ComparisonConfig.ridge_width,
                        help="random features M of RanPAC and the ridge routers (default: %(default)s)")
    parser.add_argument("--color-lr", type=float, help=f"default: {ComparisonConfig.color_lr}")
    parser.add_argument("--baseline-lr", type=float, default=ComparisonConfig.baseline_lr)
    parser.add_argument("--weight-decay", type=float,
                        help="for every method's SGD (default: each method's own: CoLoR 2e-4, fine-tuning 0)")
    parser.add_argument("--train-per-class", type=int, help="subsample the training data (split_tiny_imagenet)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--workers", type=int, default=ComparisonConfig.workers,
                        help="DataLoader worker processes of every method (default: 0, loading in this process)")
    parser.add_argument("--name", help="output folder under runs/ (default: the benchmark)")
    parser.add_argument("--publish", action="store_true",
                        help="write under benchmarks/results/ (the committed results the README's tables come "
                             "from) instead of the scratch folder runs/")
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
    hide_avalanche_deprecations()
    command = "python -m benchmarks.compare " + shlex.join(sys.argv[1:] if argv is None else argv)
    # The settings a preset may give: only those given on the command line go over the preset's.
    given = dict(epochs=args.epochs, batch_size=args.batch_size, backbone=args.backbone, architecture=args.architecture,
                 ranks=tuple(args.rank) if args.rank else None, ks=tuple(args.k) if args.k else None,
                 color_lr=args.color_lr, weight_decay=args.weight_decay, normalisation=args.normalisation)
    try:
        config = ComparisonConfig.from_preset(
            args.preset, benchmark=args.benchmark,
            methods=tuple(args.methods) if args.methods else None, seeds=tuple(args.seeds),
            baseline_seeds=tuple(args.baseline_seeds) if args.baseline_seeds else None, data=args.data,
            baseline_lr=args.baseline_lr, prototypes_per_class=args.prototypes_per_class, ridge_width=args.ridge_width,
            train_per_class=args.train_per_class, device=args.device, workers=args.workers,
            out=(RESULTS if args.publish else SCRATCH) / (args.name or args.benchmark), loggers=tuple(args.loggers),
            wandb_project=args.wandb_project, wandb_entity=args.wandb_entity, resume=args.resume,
            checkpoint_epochs=args.checkpoint_epochs, command=command,
            **{name: value for name, value in given.items() if value is not None})
    except ValueError as error:  # a bad setting: the message, as for a bad flag
        parser.error(str(error))
    if launched_by_torchrun():
        cuda = torch.cuda.is_available()
        DistributedHelper.init_distributed(config.seeds[0], backend="nccl" if cuda else "gloo", use_cuda=cuda)
    main_process = DistributedHelper.is_main_process  # read before the process group goes
    try:
        result = run_comparison(config, progress=main_process)
    except BackboneUnavailable as error:  # one line saying what to pass, no traceback from the hub
        sys.exit(f"python -m benchmarks.compare: error: {error}")
    finally:
        if is_distributed():
            torch.distributed.destroy_process_group()
    if main_process:
        print(f"\n{result['table']}\n\nwritten to {config.output_folder}")
    return result


def launched_by_torchrun() -> bool:
    """Whether torchrun started this process as one of several."""
    return "LOCAL_RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1


def hide_avalanche_deprecations() -> None:
    """Avalanche's deprecation notices about its own internals, kept off the terminal.

    A filter cannot do it: Avalanche's ``deprecated`` decorator puts its own filter first
    on every call (``warnings.simplefilter("once")``), so they are dropped when shown.
    """
    show = warnings.showwarning
    if getattr(show, "hides_avalanche_deprecations", False):  # main() called again: wrapped already
        return
    avalanche = f"{os.sep}avalanche{os.sep}"

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if not (issubclass(category, DeprecationWarning) and avalanche in filename):
            show(message, category, filename, lineno, file, line)

    showwarning.hides_avalanche_deprecations = True  # type: ignore[attr-defined]
    warnings.showwarning = showwarning


if __name__ == "__main__":
    main()
