"""What produced a comparison's runs, so ``--resume`` never mixes in runs made otherwise.

A folder's ``runs/provenance.json`` records the settings that decide every run's numbers, a
digest of the backbone's weights, a digest of the package's code, the torch version and the
thread count (float sums depend on it). ``--resume`` reads finished runs back only when all of
these are the same.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

import avalanche_color
from avalanche_color import tensors_digest
from avalanche_color.runner.config import RunConfig

PACKAGE = Path(avalanche_color.__file__).resolve().parent
# Settings that choose which runs are made or where their outputs go, not what a run computes.
NOT_IN_RESULTS = frozenset({"methods", "seeds", "baseline_seeds", "out", "loggers", "wandb_project",
                            "wandb_entity", "resume", "checkpoint_epochs", "command", "preset_settings"})


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


def weights_digest(model: nn.Module) -> str:
    return tensors_digest(model.state_dict().items(), digest_size=12)


def code_digest(package: Path = PACKAGE) -> str:
    """A digest of the package's Python files (the runner and the methods it runs)."""
    digest = hashlib.blake2b(digest_size=12)
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package.parent)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


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
