"""The comparison runner: several methods on one benchmark, same backbone, seeds, epochs and batch.

    python -m benchmarks.compare --benchmark pacs
    python -m benchmarks.compare --benchmark split_tiny_imagenet --seeds 0 1 2 --wandb-project my-project
    python -m benchmarks.compare --benchmark pacs --methods CoLoR --rank 1 8 64 --name pacs_rank_ablation

Writes under ``runs/<name>/`` (``<name>`` defaults to the benchmark; ``runs/`` is a scratch
folder git ignores; ``--publish`` writes under ``benchmarks/results/<name>/`` instead, the
committed results the README's tables are made from):
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
It refuses a folder whose runs were made with other settings, backbone weights, code, torch
version or thread count (``runs/provenance.json``, :mod:`benchmarks.compare.provenance`); a start
without ``--resume`` clears the folder's earlier runs and checkpoints.

    python -m benchmarks.compare --benchmark pacs --resume

Under torchrun (``torchrun --nproc_per_node=N -m benchmarks.compare ...``) every run trains on N
processes (NCCL on GPUs, gloo on CPU; see :mod:`avalanche_color.training.distributed`): ``--batch-size`` is
then per process, only the methods in ``DISTRIBUTED_METHODS`` are allowed, ``--resume`` is not, and
only rank 0 writes results, records, checkpoints and logs and shows progress.
"""

from __future__ import annotations

from typing import Any

import torch
from avalanche.distributed import DistributedHelper
from tqdm import tqdm

from avalanche_color.training.distributed import is_distributed
from benchmarks.backbones import load_backbone
from benchmarks.compare.config import ComparisonConfig
from benchmarks.compare.methods import Budget, Hyperparameters, needs_task_labels
from benchmarks.compare.plan import check_distributed, plan_runs
from benchmarks.compare.provenance import claim_folder, provenance
from benchmarks.compare.results import config_record, write_results
from benchmarks.compare.run import build_stream, run_method
from benchmarks.reporting import markdown_table, summary_rows
from benchmarks.reporting.machine import describe_machine
from benchmarks.streams.registry import benchmark_spec


def run_comparison(config: ComparisonConfig, progress: bool = True) -> dict[str, Any]:
    """Runs every (method, variant, seed) of ``config``, writes the results, and returns them."""
    spec = benchmark_spec(config.benchmark)
    if is_distributed():
        check_distributed(config)
    main_process = DistributedHelper.is_main_process  # True when not distributed
    progress = progress and main_process
    out = config.output_folder
    if is_distributed():  # each rank's own device (cuda:<rank> or cpu)
        device = str(DistributedHelper.make_device())
    else:
        device = config.device if config.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    backbone = load_backbone(config.backbone or spec.backbone, architecture=config.architecture)
    produced_by = provenance(config, backbone, device)
    if main_process:  # the folder is made once the backbone is there: a refused one leaves nothing behind
        out.mkdir(parents=True, exist_ok=True)
        claim_folder(out, produced_by, config.resume)
    plan = plan_runs(config, spec)
    streams: dict[tuple[int, bool], Any] = {}

    runs = []
    with tqdm(total=len(plan), desc=f"{config.benchmark}: runs", unit="run", disable=not progress) as bar:
        for method, label, seed, rank, k in plan:
            bar.set_postfix_str(f"{label}, seed {seed}")
            key = (seed, needs_task_labels(method))
            if key not in streams:
                streams[key] = build_stream(spec, config, backbone, seed, key[1])
            hp = Hyperparameters(color_lr=config.color_lr, color_rank=rank, color_k=k, baseline_lr=config.baseline_lr,
                                 weight_decay=config.weight_decay,
                                 prototypes_per_class=config.prototypes_per_class, ridge_width=config.ridge_width)
            runs.append(run_method(method, label, seed, rank, k, streams[key], spec, backbone,
                                   Budget(config.epochs, config.batch_size, device), hp, config, out))
            bar.update()

    result = {"config": config_record(config), "device": describe_machine(device),
              "backbone": produced_by["backbone"], "code": produced_by["code"], "runs": runs}
    if is_distributed():
        result["world_size"] = DistributedHelper.world_size
    if not main_process:  # every rank holds the same results; rank 0 writes them
        result["table"] = markdown_table(summary_rows(runs))
        return result
    result["table"] = write_results(result, config, spec, out)
    return result
