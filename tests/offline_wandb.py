"""Offline W&B for the tests: every file under tmp_path, and the runs read back from disk.

Offline, wandb 0.31 writes no ``wandb-summary.json`` and ``run.summary`` only holds steps
already committed, so runs are read from their ``.wandb`` file (wandb's record format).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Iterator

import pytest
import wandb
from wandb.proto import wandb_internal_pb2


@pytest.fixture
def offline_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """wandb offline, silent, every file under tmp_path; no run or wandb service left after."""
    for name, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path),
                        "WANDB_CONFIG_DIR": str(tmp_path / "config"), "WANDB_CACHE_DIR": str(tmp_path / "cache"),
                        "WANDB_DATA_DIR": str(tmp_path / "data")}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    wandb.teardown()  # a wandb set up earlier in this process would keep its old settings
    try:
        yield tmp_path
    finally:
        wandb.finish()
        wandb.teardown()


def leveldb_records(path: Path) -> Iterator[wandb_internal_pb2.Record]:
    """The records of a ``.wandb`` file (a LevelDB log: 32 KiB blocks of checksummed chunks)."""
    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0), "unknown .wandb file header"
    block, position, chunks = 32768, 7, []
    while position + 7 <= len(data):
        room = block - position % block
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        if room < 7 or (length, kind) == (0, 0):  # block padding
            position += room
            continue
        chunks.append(data[position + 7:position + 7 + length])
        position += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(chunks))
            chunks = []
            yield record


def history_by_step(path: Path) -> dict[int, dict]:
    """Every logged value by step, as ``wandb sync`` would upload it."""
    rows: dict[int, dict] = {}
    for record in leveldb_records(path):
        if record.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            rows.setdefault(row["_step"], {}).update(row)
    return rows


def exit_code(path: Path) -> int:
    [code] = [record.exit.exit_code for record in leveldb_records(path) if record.WhichOneof("record_type") == "exit"]
    return code


def offline_run_files(root: Path) -> list[Path]:
    """The ``.wandb`` file of every finished offline run under ``root``, oldest first.

    wandb's service process writes these files on its own schedule: ``run.finish()`` can
    return before the records reach the disk. Shutting the service down flushes them.
    """
    wandb.teardown()
    return [run_file for run_dir in sorted(root.rglob("offline-run-*")) for run_file in run_dir.glob("run-*.wandb")]


def offline_run_file(root: Path) -> Path:
    [run_file] = offline_run_files(root)
    return run_file


def summary(path: Path) -> dict:
    """The run's final summary values."""
    values: dict = {}
    for record in leveldb_records(path):
        if record.WhichOneof("record_type") == "summary":
            values.update({item.key: json.loads(item.value_json) for item in record.summary.update})
    return values


def run_config(path: Path) -> dict:
    """The run's config, as every config record left it."""
    values: dict = {}
    for record in leveldb_records(path):
        kind = record.WhichOneof("record_type")
        updates = record.run.config.update if kind == "run" else record.config.update if kind == "config" else ()
        values.update({item.key: json.loads(item.value_json) for item in updates})  # wandb.init's, then later ones
    return values


def logged_file(run_file: Path, row: dict, key: str) -> Path:
    """The media file (a table's JSON, an image) logged as ``key`` in a history row."""
    return run_file.parent / "files" / row[f"{key}/path"]


def logged_table(run_file: Path, row: dict, key: str) -> list[dict]:
    """A ``wandb.Table`` logged as ``key`` in a history row, as one dict per table row."""
    table = json.loads(logged_file(run_file, row, key).read_text())
    return [dict(zip(table["columns"], data)) for data in table["data"]]
