"""What produced a comparison's runs, and its output folder, which changes only when a comparison completes:
``--resume`` never mixes in runs made otherwise, and an interrupted comparison leaves the earlier results.

A folder's ``runs/provenance.json`` records the settings that decide every run's numbers, a
digest of the backbone's weights, a digest of the package's code, the torch version and the
thread count (float sums depend on it); results.json also names the git commit of the code
(:func:`code_commit`), where the package runs from a git work tree. ``--resume`` reads finished runs back only when all of
these are the same. Results files and tables also name the machine a figure was made on
(:func:`describe_machine`).

Runs write into ``<folder>/attempt/`` (run records, checkpoints, ``--tune``'s trials, logs). When every run
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

import hashlib
import json
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

import torch
from torch import nn

import avalanche_color
from avalanche_color import tensors_digest, write_atomically
from avalanche_color.runner.config import RunConfig, RunConfigError, config_record

PACKAGE = Path(avalanche_color.__file__).resolve().parent
# Settings that choose which runs are made or where their outputs go, not what a run computes.
NOT_IN_RESULTS = frozenset({"methods", "seeds", "baseline_seeds", "out", "loggers", "wandb_project",
                            "wandb_entity", "resume", "checkpoint_epochs", "command", "preset_settings"})


def weights_digest(model: nn.Module) -> str:
    return tensors_digest(model.state_dict().items(), digest_size=12)


def code_digest(package: Path = PACKAGE) -> str:
    """A digest of the package's Python files (the runner and the methods it runs)."""
    digest = hashlib.blake2b(digest_size=12)
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package.parent)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def code_commit(package: Path = PACKAGE) -> str | None:
    """The git commit the package's code is at, where it lies in a git work tree (None elsewhere, e.g. an
    installed wheel), with ``+changes`` where its files differ from that commit: a result's code is that commit
    exactly only without them."""
    def git(*arguments: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(package), *arguments], capture_output=True, text=True,
                                  timeout=30, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".")
    return commit + ("+changes" if changed else "")


def provenance(config: RunConfig, backbone: nn.Module, device: str) -> dict[str, Any]:
    settings = {name: value for name, value in config_record(config).items() if name not in NOT_IN_RESULTS}
    return {"settings": settings, "device": device, "backbone": weights_digest(backbone), "code": code_digest(),
            "torch": torch.__version__, "threads": torch.get_num_threads()}


def read_provenance(runs: Path) -> Any:
    """The record in ``runs/provenance.json``, or None where there is none."""
    stamp = runs / "provenance.json"
    return json.loads(stamp.read_text()) if stamp.is_file() else None


def differences(earlier: dict[str, Any], record: dict[str, Any]) -> list[str]:
    """What differs between two records, with the earlier and the new value: ``"epochs 2 (now 3)"`` for a
    setting, or for backbone, code, torch, threads, device."""
    old, new = earlier.get("settings", {}), record.get("settings", {})
    pairs = {key: (earlier.get(key), record.get(key)) for key in {*earlier, *record} if key != "settings"}
    pairs.update({name: (old.get(name), new.get(name)) for name in {*old, *new}})
    return [f"{name} {then!r} (now {now!r})" for name, (then, now) in sorted(pairs.items()) if then != now]


# ---------------------------------------------------------------------- the machine


def cpu_model() -> str:
    """The CPU's model name where the system tells it (Linux), else its processor, with its architecture and the
    vector instructions torch's CPU kernels use (AVX2, AVX512, ...): machines that differ there sum floats in
    another order, so their runs differ seed by seed, and a virtual machine may name its CPU by its family only."""
    name = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    return f"{name} ({platform.machine()}, {torch.backends.cpu.get_cpu_capability()})"


def describe_machine(device: str | torch.device) -> str:
    """``"cpu: <model>, N thread(s); torch X"`` or ``"cuda: <GPU name>; torch X"``."""
    device = torch.device(device)
    if device.type == "cuda":
        where = f"cuda: {torch.cuda.get_device_name(device)}"
    else:
        threads = torch.get_num_threads()
        where = f"cpu: {cpu_model()}, {threads} thread{'s' if threads != 1 else ''}"
    return f"{where}; torch {torch.__version__}"


# ---------------------------------------------------------------------- the attempt folder

ATTEMPT = "attempt"
# A comparison's own, replaced whole. The tuning trials stay with the completed comparison, so that a
# --resume of it reads them back where it would otherwise run every trial again.
REPLACED = ("runs", "checkpoints", "tuning")
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
