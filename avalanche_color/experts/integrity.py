"""A saved model folder checked before use: its ``config.json`` readable, its tensor files those it was saved with.

``save_pretrained`` records each tensor file's size and SHA-256 in ``config.json`` (``"files"``);
loading reads each file once, checks the size and then the digest of the bytes it read, and
only then parses them, so a file changed in place, truncated, or taken from another save is
refused, naming the file and what differs. Folders saved before the digests were recorded
still load, with a warning that they cannot be verified.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from avalanche_color.utils.files import PathLike, write_folder_atomically

from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save_file
from torch import Tensor


class SavedModelError(ValueError):
    """A saved model folder that cannot be read, or whose files are not those it was saved with."""


def file_record(data: bytes) -> dict[str, Any]:
    """What ``config.json`` records of a file: its SHA-256 (hex) and size in bytes."""
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def write_saved_folder(folder: PathLike, tensors: Mapping[str, Tensor], config: dict[str, Any], *,
                       tensors_file: str, config_file: str = "config.json") -> Path:
    """Write ``tensors`` (a safetensors file) and ``config`` (JSON, with the file's size and SHA-256
    under ``"files"``, checked by :func:`read_verified` on loading) into ``folder``, atomically."""
    # safetensors wants contiguous tensors that share no memory.
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}

    def write(new: Path) -> None:
        save_file(tensors, str(new / tensors_file))
        files = {tensors_file: file_record((new / tensors_file).read_bytes())}
        (new / config_file).write_text(json.dumps({**config, "files": files}, indent=2) + "\n")

    return write_folder_atomically(folder, write, replaceable=(config_file, tensors_file))


def read_saved_folder(folder: Path, *, tensors_file: str, form: str, what: str, keys: Collection[str],
                      config_file: str = "config.json") -> dict[str, Any]:
    """The config of a folder :func:`write_saved_folder` wrote: a ``FileNotFoundError`` if a file is
    missing, a ``SavedModelError`` if the config is not JSON, names another ``form`` (it is not
    ``what``, e.g. "a saved SD-LoRA model") or lacks one of ``keys``."""
    if not (folder / config_file).is_file() or not (folder / tensors_file).is_file():
        raise FileNotFoundError(f"{folder} is not a saved model: it needs {config_file} and {tensors_file} "
                                f"(written by save_pretrained)")
    saved = read_saved_config(folder, config_file)
    if saved.get("format") != form:
        raise SavedModelError(f"{folder / config_file} is not {what} (format {form!r})")
    require_keys(folder, config_file, saved, keys)
    return saved


def read_saved_config(folder: Path, name: str) -> dict[str, Any]:
    """``folder/name`` as a JSON object; a ``SavedModelError`` naming it otherwise."""
    try:
        saved = json.loads((folder / name).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SavedModelError(f"{folder}: {name} is not valid JSON (truncated or damaged?): {error}") from None
    if not isinstance(saved, dict):
        raise SavedModelError(f"{folder}: {name} holds a JSON {type(saved).__name__}, not an object")
    return saved


def require_keys(folder: Path, name: str, saved: Mapping[str, Any], keys: Collection[str]) -> None:
    """A ``SavedModelError`` naming the ``keys`` that ``saved`` (read from ``folder/name``) lacks."""
    missing = [key for key in keys if key not in saved]
    if missing:
        raise SavedModelError(f"{folder}: {name} lacks {', '.join(missing)} (damaged, or not written by "
                              f"save_pretrained)")


def read_verified(folder: Path, name: str, records: Any) -> bytes:
    """The bytes of ``folder/name``, once their size and SHA-256 match ``records[name]`` (``config.json``'s).

    ``records`` None (a folder saved before digests were recorded): the bytes, with a warning.
    """
    data = (folder / name).read_bytes()
    if records is None:
        warnings.warn(f"{folder} was saved without file digests (by an earlier avalanche_color): {name} cannot be "
                      f"verified; save the model again to record them", UserWarning, stacklevel=4)
        return data
    record = records.get(name) if isinstance(records, Mapping) else None
    if not isinstance(record, Mapping) or not isinstance(record.get("size"), int) \
            or not isinstance(record.get("sha256"), str):
        raise SavedModelError(f"{folder}: config.json records no size and SHA-256 for {name} (damaged?)")
    if len(data) != record["size"]:
        raise SavedModelError(f"{folder}: {name} is {len(data)} bytes, config.json records {record['size']} "
                              f"(truncated, or another file)")
    digest = hashlib.sha256(data).hexdigest()
    if digest != record["sha256"]:
        raise SavedModelError(f"{folder}: {name} is not the file saved with this config.json: SHA-256 "
                              f"{digest[:16]}..., recorded {record['sha256'][:16]}... (changed since it was saved, "
                              f"or another save's file)")
    return data


def load_tensors(folder: Path, name: str, data: bytes) -> dict[str, Tensor]:
    """The tensors of a safetensors file's bytes (on the CPU); a ``SavedModelError`` naming it if unreadable."""
    try:
        return load_safetensors(data)
    except SafetensorError as error:
        raise SavedModelError(f"{folder}: {name} is not a readable safetensors file: {error}") from None
