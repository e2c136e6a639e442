"""A saved model folder checked before use: its ``config.json`` and tensor file those it was saved with.

``save_pretrained`` records each tensor file's size and SHA-256 in ``config.json`` (``"files"``),
and writes a copy of ``config.json``'s content (all but ``"files"``) into the tensor file's
safetensors metadata, so the recorded SHA-256 covers the options and the experts' records too.
Loading reads the tensor file once, checks the size and then the digest of the bytes it read,
then compares ``config.json`` with the copy the verified file holds (:func:`check_config_unchanged`),
and only then parses the tensors: a file changed in place, truncated, or taken from another
save, and a ``config.json`` edited since the save (an option, an expert's entry dropped or its
classes swapped) are refused, naming the folder, the file and what differs. Folders saved before
the digests (or the copy) were recorded still load, with a warning that they cannot be verified.
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


# The safetensors metadata key of the copy of config.json's content (without "files").
CONFIG_COPY = "avalanche_color.config"


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
        save_file(tensors, str(new / tensors_file), metadata={CONFIG_COPY: json.dumps(config, sort_keys=True)})
        files = {tensors_file: file_record((new / tensors_file).read_bytes())}
        (new / config_file).write_text(json.dumps({**config, "files": files}, indent=2) + "\n")

    return write_folder_atomically(folder, write, replaceable=(config_file, tensors_file))


def read_saved_folder(folder: Path, *, tensors_file: str, form: str, what: str, keys: Collection[str],
                      model_class: str, config_file: str = "config.json") -> dict[str, Any]:
    """The config of a folder :func:`write_saved_folder` wrote for a ``model_class``: a ``FileNotFoundError``
    if a file is missing, a ``SavedModelError`` if the config is not JSON, names another model class (both
    named, and the call that loads it), another ``form`` (it is not ``what``, e.g. "a saved SD-LoRA model")
    or lacks one of ``keys``."""
    if (folder / config_file).is_file():
        other = read_saved_config(folder, config_file).get("model")
        if isinstance(other, str) and other != model_class:
            raise SavedModelError(f"{folder} holds a saved {other} (its {config_file} says so), not a {model_class}: "
                                  f"load it with {other}.from_pretrained(folder, backbone), or with "
                                  f"avalanche_color.load_pretrained(folder, backbone), which reads the class")
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


def check_config_unchanged(folder: Path, config_file: str, saved: Mapping[str, Any], tensors_file: str,
                           data: bytes) -> None:
    """Refuse a ``config.json`` (``saved``) that differs from the copy in the tensor file's bytes ``data``.

    Call it with the bytes :func:`read_verified` returned, before ``saved`` is changed in any way:
    the copy is then the one written with the save. The ``SavedModelError`` names the folder, the
    file and each difference (``options.alpha: saved 8.0, found 40``). A tensor file without a copy
    (written by an earlier avalanche_color) loads with a warning, unless its digests were not
    recorded either (:func:`read_verified` has warned already).
    """
    copy = _config_copy(data)
    if copy is None:
        if saved.get("files") is not None:
            warnings.warn(f"{folder} was saved by an earlier avalanche_color, without a copy of {config_file} in "
                          f"{tensors_file}: its options and experts' records cannot be verified; save the model "
                          f"again to record them", UserWarning, stacklevel=4)
        return
    differences = json_differences(copy, {key: value for key, value in saved.items() if key != "files"})
    if differences:
        shown = "; ".join(differences[:8]) + ("; ..." if len(differences) > 8 else "")
        raise SavedModelError(
            f"{folder}: {config_file} is not the one saved with {tensors_file} (changed since the save): {shown}. "
            f"Restore it (the saved values are those named), or save the model again")


def json_differences(saved: Any, found: Any, where: str = "") -> list[str]:
    """Each place where the JSON values ``saved`` and ``found`` differ, as ``"path: saved .., found .."``."""
    if isinstance(saved, dict) and isinstance(found, dict):
        differences = []
        for key in sorted(set(saved) | set(found), key=str):
            path = f"{where}.{key}" if where else str(key)
            if key not in found:
                differences.append(f"{path}: saved {saved[key]!r}, missing now")
            elif key not in saved:
                differences.append(f"{path}: not saved, found {found[key]!r}")
            else:
                differences += json_differences(saved[key], found[key], path)
        return differences
    nested = (dict, list)
    if isinstance(saved, list) and isinstance(found, list) and any(isinstance(v, nested) for v in saved + found):
        differences = []
        if len(saved) != len(found):
            differences.append(f"{where}: saved {len(saved)} entries, found {len(found)}")
        for index, (before, after) in enumerate(zip(saved, found)):
            differences += json_differences(before, after, f"{where}[{index}]")
        return differences
    # Values (and lists of values, such as an expert's classes) are compared whole.
    if type(saved) is not type(found) and not (_is_number(saved) and _is_number(found)) or saved != found:
        return [f"{where}: saved {saved!r}, found {found!r}"]
    return []


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _config_copy(data: bytes) -> Any:
    """The copy of config.json in a safetensors file's metadata, or None if it has none (or is unreadable:
    :func:`load_tensors` names that)."""
    try:
        length = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + length].decode("utf-8"))
        copy = header.get("__metadata__", {}).get(CONFIG_COPY)
        return None if copy is None else json.loads(copy)
    except (ValueError, AttributeError, UnicodeDecodeError):
        return None
