"""One tuning rule for every method: each method's learning rate chosen from one grid on one validation split.

With ``--tune lr`` a comparison first runs every method that trains by gradient once per value of
``--lr-grid`` on a validation benchmark (:func:`~avalanche_color.benchmarks.validation.validation_benchmark`:
``--held-out`` of each training experience's classes, seed 0, the same split for every method),
at the comparison's budget, rank and k, and keeps the value with the best average accuracy
after the last experience (ties: the smaller lr). Every seed of the comparison then runs with
it, and results.json records the rule, the grid, each trial and each choice. The trials live in
the attempt folder's ``tuning/``, so ``--resume`` keeps those that finished.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, NamedTuple

from tqdm import tqdm

from avalanche_color.benchmarks.validation import validation_benchmark
from avalanche_color.runner.config import RunConfig
from avalanche_color.runner.methods import method
from avalanche_color.runner.plan import PlannedRun
from avalanche_color.runner.run import LearningRate, build_stream, run_method

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


def tune_learning_rates(config: RunConfig, ready: Any, attempt: Path, progress: bool = True) -> dict[str, Choice]:
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
                record = run_method(planned, benchmarks[entry.task_labels], ready.spec, ready.backbone, trial_config,
                                    ready.device, attempt / "tuning", lr=LearningRate(lr, "a --tune lr trial"))
                trials[lr] = record["average_accuracy"]
                bar.update()
            best = max(trials, key=lambda lr: (trials[lr], -lr))
            choices[name] = Choice(best, trials[best], trials)
    return choices


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
