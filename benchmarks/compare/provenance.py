"""What produced a comparison folder's runs, so ``--resume`` never mixes in runs made otherwise.

A folder's ``runs/provenance.json`` records the settings that decide every run's numbers, a
digest of the backbone's weights, a digest of the package's and the benchmarks' code, the torch
version and the thread count (float sums depend on it). ``--resume`` reads finished runs back
only when all of these are the same; a fresh start drops the records of an earlier comparison.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from avalanche_color.utils.digests import tensors_digest
from avalanche_color.utils.files import write_atomically
from benchmarks import REPOSITORY
from benchmarks.compare.config import ComparisonConfig
from benchmarks.compare.results import config_record

CODE = ("avalanche_color", "benchmarks")
# Settings that choose which runs are made or where their outputs go, not what a run computes.
NOT_IN_RESULTS = frozenset({"methods", "seeds", "baseline_seeds", "out", "loggers", "wandb_project",
                            "wandb_entity", "resume", "checkpoint_epochs", "command", "preset_settings"})


def weights_digest(model: nn.Module) -> str:
    return tensors_digest(model.state_dict().items(), digest_size=12)


def code_digest(root: Path = REPOSITORY) -> str:
    digest = hashlib.blake2b(digest_size=12)
    for package in CODE:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def provenance(config: ComparisonConfig, backbone: nn.Module, device: str) -> dict[str, Any]:
    settings = {name: value for name, value in config_record(config).items() if name not in NOT_IN_RESULTS}
    return {"settings": settings, "device": device, "backbone": weights_digest(backbone), "code": code_digest(),
            "torch": torch.__version__, "threads": torch.get_num_threads()}


def claim_folder(out: Path, record: dict[str, Any], resume: bool) -> None:
    """Check that ``--resume`` may reuse ``out``'s runs, or clear them for a fresh start; then stamp it."""
    stamp = out / "runs" / "provenance.json"
    if resume:
        earlier = json.loads(stamp.read_text()) if stamp.exists() else None
        if earlier is None and any((out / "runs").glob("*.json")):
            raise ValueError(f"--resume: the runs in {out / 'runs'} do not say what produced them; "
                             "run without --resume to start over, or pass another --name")
        if earlier is not None and earlier != record:
            changed = sorted(key for key in {*earlier, *record} if earlier.get(key) != record.get(key))
            raise ValueError(f"--resume: the runs in {out / 'runs'} were made with a different {', '.join(changed)}; "
                             "run without --resume to start over, or pass another --name")
    else:
        for stale in ("runs", "checkpoints"):
            shutil.rmtree(out / stale, ignore_errors=True)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(stamp, (json.dumps(record, indent=2) + "\n").encode())
