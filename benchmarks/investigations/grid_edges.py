"""Did ``--tune lr`` choose inside its grid? A tuned comparison's summary marks every method whose lr is
the grid's lowest or highest: its best lr may lie beyond. This runs, for each of them, the trials one
grid step further out, under the comparison's own rule (the same validation split, budget, rank and k),
and goes on outwards while the validation accuracy still rises.

    python -m benchmarks.investigations.grid_edges benchmarks/results/pacs_vit_ti [--steps 2] [--methods Naive EWC]

It also reads a comparison still running (or interrupted) after its tuning: the methods whose every
trial has finished, from the attempt folder, so that an edge shows before the seeds' runs are spent.

The steps continue the grid's own spacing (the default 0.001, 0.003, ..., 0.1 continues with 0.0003,
0.0001 below and 0.3, 1 above). A method that gains beyond the edge was tuned short of its best, and its
row in the table is a lower bound; by how much shows on validation, not on the test set, as the rule
itself. The comparison's settings (data from ``AVALANCHE_COLOR_DATA``, weights from
``AVALANCHE_COLOR_MODELS`` where results.json names a file) and this code make the trials; the record
says which code and machine. ``--recheck`` also reruns the tuned lr's trial: the same number again
says this code and machine compute as the comparison's did, so the trials beyond compare with it
exactly. Trials resume: they live in ``runs/grid_edges/<folder name>/``. Writes ``grid_edges.json``
beside results.json (with ``--methods``, keeping what an earlier check found for the others; each
entry names the code and machine that made it) and prints the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
from pathlib import Path
from typing import Any, Optional, Sequence

from avalanche_color import write_atomically
from avalanche_color.runner.comparison import Choice, best_lr, prepare, tune_learning_rates, tuning_record
from avalanche_color.runner.config import RunConfig, RunConfigError
from avalanche_color.runner.provenance import ATTEMPT, describe_machine, start_attempt
from avalanche_color.runner.report import grid_end, markdown_table, percent
from benchmarks import REPOSITORY

SCRATCH = REPOSITORY / "runs" / "grid_edges"
# Settings results.json records that a fresh RunConfig does not take back.
NOT_SETTINGS = ("preset_settings",)


def beyond(grid: Sequence[float], direction: int, steps: int) -> list[float]:
    """``steps`` learning rates past the grid's lowest (``direction`` -1) or highest (+1) value, spaced as
    the grid is: its ratios repeat with their period (1, 3, 10, ... alternates x3 and x3.33), a grid
    whose ratios follow no period continues with their geometric mean."""
    grid = sorted(grid)
    if len(grid) < 2:
        raise ValueError(f"grid must hold at least two learning rates to continue its spacing, got {list(grid)}")
    ratios = [high / low for low, high in zip(grid, grid[1:])]
    period = next((p for p in range(1, len(ratios) // 2 + 1)
                   if all(math.isclose(ratios[i], ratios[i + p], rel_tol=1e-6) for i in range(len(ratios) - p))),
                  None)
    values, lr = [], grid[0] if direction < 0 else grid[-1]
    for step in range(1, steps + 1):
        if period is None:
            ratio = (grid[-1] / grid[0]) ** (1 / len(ratios))
        elif direction < 0:  # the ratio that would have led up to the value below
            ratio = ratios[-step % period]
        else:
            ratio = ratios[(len(ratios) + step - 1) % period]
        lr = float(f"{lr * ratio ** direction:.6g}")
        values.append(lr)
    return values


def tuned_comparison(folder: Path) -> tuple[dict[str, Any], dict[str, Any], str]:
    """A tuned comparison's settings, tuning record and code digest: from results.json once it has
    completed; before that from its attempt folder, with the methods whose every trial has finished (so
    that edges show before the seeds' runs are spent on a choice at the grid's end)."""
    results_file, attempt = folder / "results.json", folder / ATTEMPT
    if results_file.is_file():
        results = json.loads(results_file.read_text())
        if not results.get("tuning"):
            raise ValueError(f"{str(folder)!r} holds no tuned comparison (its results.json has no 'tuning': run "
                             "it with --tune lr)")
        return results["config"], results["tuning"], results["code"]
    stamp = attempt / "runs" / "provenance.json"
    if not stamp.is_file() or not (attempt / "tuning" / "runs").is_dir():
        raise ValueError(f"{str(folder)!r} holds no tuned comparison: no results.json, and no attempt with tuning "
                         "trials (run it with --tune lr)")
    provenance = json.loads(stamp.read_text())
    settings = provenance["settings"]
    grid = settings["lr_grid"]
    trials: dict[str, dict[float, Optional[float]]] = {}
    for path in sorted((attempt / "tuning" / "runs").glob("*.json")):
        trial = json.loads(path.read_text())
        trials.setdefault(trial["method"], {})[trial["lr"]] = trial["average_accuracy"]
    choices = {}
    for name, found in trials.items():
        best = best_lr(found)
        if set(found) == set(grid) and best is not None:  # every trial finished
            choices[name] = Choice(best, found[best], {lr: found[lr] for lr in grid})
    return settings, tuning_record(settings_config(settings), choices), provenance["code"]


def settings_config(settings: dict[str, Any], **changes: Any) -> RunConfig:
    """A RunConfig of the settings a comparison recorded, with ``changes``."""
    return RunConfig(**{**{name: value for name, value in settings.items() if name not in NOT_SETTINGS},
                        **changes})


def comparison_config(settings: dict[str, Any], scratch: Path) -> RunConfig:
    """The tuned comparison's settings, its trials written under ``scratch``."""
    return settings_config(settings, out=scratch, resume=True, loggers=(), wandb_project=None, seeds=(0,),
                           baseline_seeds=(0,))


def trial_at(config: RunConfig, ready: Any, attempt: Path, name: str, lr: float, progress: bool) -> Optional[float]:
    """Method ``name``'s validation accuracy at ``lr`` under the comparison's rule; None where training diverged."""
    try:
        return tune_learning_rates(dataclasses.replace(config, methods=(name,), lr_grid=(lr,)), ready, attempt,
                                   progress)[name].trials[lr]
    except FloatingPointError:
        return None


def check_edges(folder: Path, steps: int = 2, methods: Optional[Sequence[str]] = None,
                scratch: Optional[Path] = None, recheck: bool = False, progress: bool = True) -> dict[str, Any]:
    """Runs the trials past each edge choice of ``folder``'s tuned comparison; returns (and writes to
    ``folder/grid_edges.json``) what each method scored beyond its edge. ``recheck`` also reruns the
    chosen lr's trial: equal to the comparison's where this code and machine compute as the comparison's did,
    so that the trials beyond compare with it."""
    settings, tuning, comparison_code = tuned_comparison(folder)
    grid = tuning["grid"]
    unknown = sorted(set(methods or ()) - set(tuning["choices"]))
    if unknown:
        raise ValueError(f"methods {unknown} were not tuned in {str(folder)!r}: it tuned {sorted(tuning['choices'])}")
    if len(grid) < 2:
        raise ValueError(f"{str(folder)!r} was tuned on a grid of one lr, {grid}: it has no spacing to continue")
    ends = {name: grid_end(choice["lr"], grid) for name, choice in tuning["choices"].items()
            if methods is None or name in methods}
    edges = {name: end for name, end in ends.items() if end is not None}
    config = comparison_config(settings, scratch or SCRATCH / folder.name)
    found: dict[str, Any] = {}
    ready: Any = None
    if edges:
        try:
            ready = prepare(dataclasses.replace(config, methods=tuple(edges)))
        except RunConfigError as error:
            if error.field != "resume":
                raise
            raise ValueError(f"the trials in {str(config.output_folder)!r} were made by other code or settings "
                             "than this check's: remove that folder to run them again") from error
        attempt = start_attempt(config.output_folder, ready.record, resume=True)
        made_by = {"code": ready.record["code"], "device": describe_machine(ready.device)}
    for name, direction in edges.items():
        choice = tuning["choices"][name]
        score = functools.partial(trial_at, config, ready, attempt, name, progress=progress)
        found[name] = {"edge": "lowest" if direction < 0 else "highest", "lr": choice["lr"],
                       "validation_accuracy": choice["validation_accuracy"], **made_by}
        if recheck:  # first, so that the trials beyond are held against a trial of the same code
            found[name]["rerun"] = score(choice["lr"])
        best = starting_point(found[name])
        trials: dict[str, Optional[float]] = {}
        for lr in beyond(grid, direction, steps):
            trials[f"{lr:g}"] = accuracy = score(lr)
            if accuracy is None or accuracy <= best:
                break  # past the best: further out only falls
            best = accuracy
        found[name]["beyond"] = trials
    record = {"comparison": folder.name, "grid": grid, "steps": steps, "rule": tuning["rule"],
              "comparison_code": comparison_code}
    checked = {**earlier_check(folder, record), **found}
    record["methods"] = {name: checked[name] for name in tuning["choices"] if name in checked}
    write_atomically(folder / "grid_edges.json", (json.dumps(record, indent=2) + "\n").encode())
    return record


def earlier_check(folder: Path, record: dict[str, Any]) -> dict[str, Any]:
    """What an earlier check of the same comparison (same grid, steps and comparison code) found, so that
    checking some methods again keeps the others' entries. Each entry names the code and machine that made
    it; records written before that named them once for all, and that is carried into each entry."""
    path = folder / "grid_edges.json"
    if not path.exists():
        return {}
    earlier = json.loads(path.read_text())
    if any(earlier.get(key) != record[key] for key in ("comparison", "grid", "steps", "comparison_code")):
        return {}
    shared = {key: earlier[key] for key in ("code", "device") if key in earlier}
    return {name: {**shared, **found} for name, found in earlier["methods"].items()}


def starting_point(found: dict[str, Any]) -> float:
    """What the trials beyond must beat: the tuned lr's trial rerun by this code where it was (the same code
    and machine), else the comparison's own."""
    rerun = found.get("rerun")
    return rerun if rerun is not None else found["validation_accuracy"]


def edges_table(record: dict[str, Any]) -> str:
    """One row per method tuned at an edge: its choice, the trials beyond, and what they say."""
    rows = []
    reruns = any("rerun" in found for found in record["methods"].values())  # a partial recheck shows "-"
    for name, found in record["methods"].items():
        scored = {lr: accuracy for lr, accuracy in found["beyond"].items() if accuracy is not None}
        best_beyond = max(scored, key=scored.__getitem__, default=None)
        gain = None if best_beyond is None else 100 * (scored[best_beyond] - starting_point(found))
        verdict = (f"+{gain:.1f} at lr {best_beyond}: tuned short of its best" if gain is not None and gain > 0
                   else "the edge was its best")
        rerun = {"tuned lr rerun": percent(found["rerun"]) if "rerun" in found else "-"} if reruns else {}
        trials = ", ".join(f"{lr}: {percent(accuracy)}" for lr, accuracy in found["beyond"].items())
        row = {"method": name, "tuned lr": f"{found['lr']:g} (the grid's {found['edge']})",
               "validation": percent(found["validation_accuracy"]), **rerun, "beyond the edge": trials,
               "verdict": verdict}
        rows.append(row)
    return markdown_table(rows) if rows else "every tuned lr lies inside the grid"


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, help="tuned comparisons' folders (results.json inside)")
    parser.add_argument("--steps", type=int, default=2, help="at most this many lrs past each edge (default 2)")
    parser.add_argument("--methods", nargs="+", help="only these methods (default: every one tuned at an edge)")
    parser.add_argument("--recheck", action="store_true",
                        help="also rerun each method's tuned lr, to see this code and machine give its trial again")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    for folder in args.folders:
        record = check_edges(folder, args.steps, args.methods, recheck=args.recheck)
        print(f"{folder.name} (grid {record['grid']}):\n{edges_table(record)}\n")


if __name__ == "__main__":
    main()
