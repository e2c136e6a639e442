"""The checkpoint file of a CoLoR run: what it holds, how it is written and read back.

This is the project's own format, not Avalanche's ``save_checkpoint``. That one
dill-pickles the whole strategy (frozen backbone, data loaders, loggers and
plugins included), so a file is as large as the backbone, breaks when any of
those objects stops pickling (with torch >= 2.13 the optimiser class does:
"Can't pickle sentinel") and needs an unsafe unpickler to read. A CoLoR run's
learned state is small and all tensors, so it is saved as such:

* line 1: a JSON header: format name, format version, the payload's size and
  SHA-256, and the stream position (readable with ``head -1``);
* then the payload: ``torch.save`` of a dict of tensors and plain values, read
  with ``torch.load(weights_only=True)`` (no code runs when loading).

The payload holds the experts, heads, prototypes and class maps
(:meth:`ExpertViT.experts_state_dict`, no backbone weights), the model's
settings (rank, alpha, routing features, router, distance, feature normalisation), a fingerprint
of the frozen backbone, the stream position (experiences finished, epochs
finished in the current one), the evaluation records so far, the optimiser and
scheduler state when saved mid-experience, and the Python, NumPy and torch
(CPU and CUDA) RNG states. Files are written atomically: a temporary file in
the same folder, flushed and fsynced, then renamed over the old one, so a
crash mid-save leaves the previous checkpoint intact.

Loading checks everything before it changes anything: a file that is
truncated, corrupt, of another format version, or written for another
backbone, rank, alpha, routing features, router or class set is refused with a
:class:`CheckpointError` naming what differs, and the model stays as it was; so is one written
under other training options (``k``, ``lr``, ``train_epochs``, ...), unless the caller allows them
(``train_stream(..., allow_changed=[...])``).
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from torch import Tensor, nn

from avalanche_color.experts.model_state import backbone_fingerprint, model_settings
from avalanche_color.utils.files import PathLike, write_atomically

FORMAT = "avalanche_color.checkpoint"
VERSION = 2  # 2: experts carry expert_finished (revisited experiences get a further expert)


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read, or does not fit the run it is loaded into."""


@dataclass
class Checkpoint:
    """The content of a checkpoint file (nothing applied to a model yet).

    Attributes:
        experiences_done: training experiences finished (the next one to train).
        epochs_done: epochs finished of experience ``experiences_done``; 0 at an
            experience boundary, else the optimiser and scheduler states are set.
        train_epochs: the strategy's epochs per experience when it was saved.
        records: one evaluation record (metric name -> value) per evaluated experience.
        settings: the model's class, rank, alpha, routing features, router, distance and normalisation.
        backbone: fingerprint of the frozen backbone (see :func:`~avalanche_color.experts.model_state.backbone_fingerprint`).
        stream_classes: the classes of every training experience of the stream, if known.
        experts: the model's :meth:`~ExpertViT.experts_state_dict`.
        model_extras: Avalanche's bookkeeping on the model (``max_class_label``, ...).
        optimizer, lr_scheduler: their ``state_dict`` mid-experience, else None.
        rng: the random generators' states at saving time.
        options: the strategy's options (every field of its config, as JSON values) when it was
            saved; None for strategies without a config and for checkpoints written before they
            were recorded. A resume under other options that change the run is refused
            (:func:`~avalanche_color.training.resume_options.changed_options`).
    """

    experiences_done: int
    epochs_done: int
    train_epochs: int
    records: list[dict[str, Any]]
    settings: dict[str, Any]
    backbone: str
    stream_classes: Optional[list[list[int]]]
    experts: dict[str, Tensor]
    model_extras: dict[str, Any] = field(default_factory=dict)
    optimizer: Optional[dict[str, Any]] = None
    lr_scheduler: Optional[dict[str, Any]] = None
    rng: dict[str, Any] = field(default_factory=dict)
    options: Optional[dict[str, Any]] = None


# ---------------------------------------------------------------------- file


def write_checkpoint(path: PathLike, checkpoint: Checkpoint) -> None:
    """Write ``checkpoint`` to ``path`` atomically (the old file stays until the new one is complete)."""
    buffer = io.BytesIO()
    torch.save(_payload(checkpoint), buffer)
    payload = buffer.getvalue()
    header = {
        "format": FORMAT,
        "version": VERSION,
        "payload_bytes": len(payload),
        "payload_sha256": hashlib.sha256(payload).hexdigest(),
        "experiences_done": checkpoint.experiences_done,
        "epochs_done": checkpoint.epochs_done,
    }
    write_atomically(path, json.dumps(header).encode() + b"\n" + payload)


def read_header(path: PathLike) -> dict[str, Any]:
    """The JSON header of a checkpoint file (format, version, position), without the payload."""
    with open(path, "rb") as file:
        return _parse_header(Path(path), file.readline())


def read_checkpoint(path: PathLike) -> Checkpoint:
    """Read and verify a checkpoint file; nothing is applied to any model.

    Raises:
        CheckpointError: the file is truncated, corrupt, of another format or version.
    """
    path = Path(path)
    raw = path.read_bytes()
    first_line, _, payload = raw.partition(b"\n")
    header = _parse_header(path, first_line)
    expected = header["payload_bytes"]
    if len(payload) != expected:
        raise CheckpointError(
            f"checkpoint {path} is truncated or damaged: its payload has {len(payload)} bytes, "
            f"the header says {expected}; resume from an intact checkpoint or start over"
        )
    if hashlib.sha256(payload).hexdigest() != header["payload_sha256"]:
        raise CheckpointError(f"checkpoint {path} is corrupt: its payload does not match the header's SHA-256")
    try:
        content = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
        return Checkpoint(**content)
    except Exception as error:  # a payload that passed the checksum but is not ours
        raise CheckpointError(f"checkpoint {path} has an unreadable payload: {error}") from error


def check_fits(checkpoint: Checkpoint, model: nn.Module, path: PathLike,
               stream_classes: Optional[list[list[int]]] = None,
               fingerprint: Optional[str] = None) -> None:
    """Refuse a checkpoint whose experts do not fit ``model`` (or whose classes not the stream).

    Every difference is named; nothing is changed.
    """
    problems = []
    current = model_settings(model)
    saved = checkpoint.settings
    for name in sorted(set(current) | set(saved)):
        if saved.get(name) != current.get(name):
            problems.append(f"{name}: checkpoint {saved.get(name)!r}, model {current.get(name)!r}")
    fingerprint = fingerprint or backbone_fingerprint(model)
    if checkpoint.backbone != fingerprint:
        problems.append(
            f"backbone: the checkpoint's experts were trained on another backbone "
            f"(fingerprint {checkpoint.backbone[:12]}, this model's {fingerprint[:12]})"
        )
    if stream_classes is not None and checkpoint.stream_classes is not None \
            and checkpoint.stream_classes != stream_classes:
        problems.append(
            f"classes: the checkpoint's stream has classes {checkpoint.stream_classes} per experience, "
            f"this stream {stream_classes}"
        )
    if problems:
        raise CheckpointError(f"checkpoint {path} does not fit this run: " + "; ".join(problems))


def _payload(checkpoint: Checkpoint) -> dict[str, Any]:
    payload = dict(vars(checkpoint))
    payload["experts"] = {k: v.detach().to("cpu") for k, v in checkpoint.experts.items()}
    # Records travel as JSON text: any metric value that is not plain data fails here, at saving.
    payload["records"] = json.loads(json.dumps(checkpoint.records))
    payload["options"] = None if checkpoint.options is None else json.loads(json.dumps(checkpoint.options))
    return payload


def _parse_header(path: Path, line: bytes) -> dict[str, Any]:
    try:
        header = json.loads(line)
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CheckpointError(
            f"{path} is not an avalanche_color checkpoint (or its header is truncated): "
            f"its first line should be a JSON header with format {FORMAT!r}"
        )
    if header.get("version") != VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format version {header.get('version')!r}; this avalanche_color "
            f"reads version {VERSION}"
        )
    return header
