"""A comparison's output folder changes only when a comparison completes.

Runs write into ``<folder>/attempt/`` (run records, checkpoints, logs). When every run
has finished, those replace the folder's own and the result files are written; an interrupted or
failed comparison leaves the folder's earlier results as they were. W&B's files go to
``<folder>/wandb/`` directly, one folder per W&B run, so the path W&B prints stays valid after the
comparison completes (an attempt folder of an earlier version may still hold some: they are merged). ``--resume`` continues the
attempt (or the completed comparison) when it was made with the same settings, backbone, code,
torch and thread count, and is refused otherwise, before anything changes. A failed attempt never
blocks a ``--resume`` with the folder's original settings: one that finished no run, or one made
with other settings than the completed comparison being resumed, is set aside (replaced).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from avalanche_color import write_atomically
from avalanche_color.runner.config import RunConfigError
from avalanche_color.runner.provenance import differences, read_provenance

ATTEMPT = "attempt"
REPLACED = ("runs", "checkpoints")  # a comparison's own: replaced whole
MERGED = ("logs", "wandb")  # one entry per run (W&B: per run and attempt): replaced entry by entry


def check_folder(out: Path, record: dict[str, Any], resume: bool) -> None:
    """Refuses (:class:`RunConfigError`) an output folder this comparison cannot write, changing nothing."""
    if out.exists() and not out.is_dir():
        raise RunConfigError("name", str(out), "is a file, not a folder: pass another --name")
    if not resume:
        return
    attempt_runs = out / ATTEMPT / "runs"
    runs = attempt_runs if attempt_runs.is_dir() and not stale_attempt(out, record) else out / "runs"
    earlier = read_provenance(runs)
    fix = ("run without --resume (the folder's results stay until the new comparison completes), or pass another "
           "--name to keep both")
    if earlier is None and any(runs.glob("*.json")):
        raise RunConfigError("resume", True, f"cannot continue the runs in {str(runs)!r}: they do not say what "
                                             f"produced them; {fix}")
    if earlier is not None and earlier != record:
        raise RunConfigError("resume", True, f"cannot continue the runs in {str(runs)!r}: they were made with "
                                             f"other settings: {', '.join(differences(earlier, record))}; {fix}")


def start_attempt(out: Path, record: dict[str, Any], resume: bool) -> Path:
    """The attempt folder, stamped with ``record``: an earlier interrupted one continued (``resume``) or
    replaced; a resumed completed comparison's runs and checkpoints carried into it."""
    attempt = out / ATTEMPT
    if not resume or stale_attempt(out, record):
        shutil.rmtree(attempt, ignore_errors=True)
    elif not attempt.exists():
        for name in REPLACED:
            if (out / name).is_dir():
                shutil.copytree(out / name, attempt / name)
    (attempt / "runs").mkdir(parents=True, exist_ok=True)
    write_atomically(attempt / "runs" / "provenance.json", (json.dumps(record, indent=2) + "\n").encode())
    return attempt


def stale_attempt(out: Path, record: dict[str, Any]) -> bool:
    """Whether ``out``'s attempt folder is one a ``--resume`` with ``record`` sets aside: it exists and either
    finished no run (no run record, no checkpoint: nothing to continue), or was made with other settings
    than ``record`` while the folder's completed comparison was made with ``record``'s."""
    attempt = out / ATTEMPT
    if not attempt.is_dir():
        return False
    runs = attempt / "runs"
    # Its work: the runs' records and checkpoints, and those of --tune's trials (attempt/tuning/).
    records = [path for folder in (runs, attempt / "tuning" / "runs") for path in folder.glob("*.json")
               if path.name != "provenance.json"]
    checkpoints = [path for folder in (attempt / "checkpoints", attempt / "tuning" / "checkpoints")
                   for path in folder.glob("*")]
    if not records and not checkpoints:
        return True
    return read_provenance(runs) != record and read_provenance(out / "runs") == record


def complete_attempt(out: Path, attempt: Path) -> None:
    """Moves the finished attempt's files over the folder's own, then removes the attempt."""
    for name in REPLACED:  # an earlier comparison's records and checkpoints go with it
        shutil.rmtree(out / name, ignore_errors=True)
        if (attempt / name).is_dir():
            (attempt / name).rename(out / name)
    for name in MERGED:
        if (attempt / name).is_dir():
            (out / name).mkdir(exist_ok=True)
            for entry in (attempt / name).iterdir():
                target = out / name / entry.name
                if target.is_dir():
                    shutil.rmtree(target)
                elif target.exists():
                    target.unlink()
                entry.rename(target)
    shutil.rmtree(attempt)
