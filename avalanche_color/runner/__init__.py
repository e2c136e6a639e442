"""The comparison runner (``avalanche-color compare``): several methods on one benchmark, same backbone, seeds, epochs and batch.

    avalanche-color compare --benchmark digits_class --methods CoLoR Naive --epochs 1
    avalanche-color compare --benchmark split_tiny_imagenet --seeds 0 1 2 --wandb-project my-project
    avalanche-color compare --benchmark pacs --methods CoLoR --rank 1 8 64 --name pacs_rank_ablation

(``python -m avalanche_color.runner compare ...`` is the same command.) Writes under
``runs/<name>/`` in the folder it runs from (``<name>`` defaults to the benchmark; ``--out-dir DIR``
writes under ``DIR/<name>/`` instead): ``results.json`` (config and every run: accuracy matrix,
average accuracy, forgetting, routing accuracy, trainable parameters, wall and CPU time),
``runs.csv``, ``accuracy_matrices.csv``, ``summary.md`` (mean ± std over seeds, with the
command) and ``accuracy.png``; Avalanche's text, CSV and Tensorboard logs under ``logs/``; a
checkpoint per run of a method that checkpoints under ``checkpoints/`` (after every experience, and every
``--checkpoint-epochs`` epochs) and every finished run's record under ``runs/``; and, with
``--wandb-project``, one W&B run per (method, seed) grouped by benchmark, its config the
method's options (``WANDB_MODE=offline`` works without network; the W&B files go under
``<name>/wandb``).

Every setting and the data are checked before the output folder changes, and the folder's
results are replaced only when the whole comparison completes (:mod:`avalanche_color.runner.provenance`).

The methods that train only a few parameters on the frozen backbone run for every seed in ``--seeds``;
the others, which cost far more, for ``--baseline-seeds`` (default: the first seed). A method with LoRA
runs for every ``--rank``, a prototype-routed one for every ``--k`` (the ablations). Each of these flags'
help names the methods that take it.

``--resume`` continues an interrupted comparison in the same folder: finished runs are read back,
a run that checkpoints continues from its checkpoint (the accuracy matrix so far comes back with it,
so the results equal an uninterrupted comparison's), a baseline run starts over. Give the same
arguments as the interrupted command; a resumed run's wall and CPU seconds count its resumed
part. It refuses runs made with other settings, backbone weights, code, torch version or thread
count (:mod:`avalanche_color.runner.provenance`).

Under torchrun (``torchrun --nproc_per_node=N -m avalanche_color.runner compare ...``) every run
trains on N processes (NCCL on GPUs, gloo on CPU): ``--batch-size`` is then per process, only the
methods that declare it run, ``--resume`` is not allowed, and only rank 0 writes results, records,
checkpoints and logs and shows progress.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from avalanche_color.runner.config import RunConfig, RunConfigError
from avalanche_color.runner.methods import METHODS, Method, MethodRun

# Imported on first use: they import torch, which the command line's --help does without.
_LAZY = {"run_comparison": "comparison", "load_backbone": "backbone_loading", "build_stream": "run"}

__all__ = ["METHODS", "Method", "MethodRun", "RunConfig", "RunConfigError", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(f"avalanche_color.runner.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
