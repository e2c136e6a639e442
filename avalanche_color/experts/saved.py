"""A routed expert model's learned state outside the model: the folder ``save_pretrained`` writes and
``from_pretrained`` reads, checked before use, and what a stored state and a checkpoint record of the model.

A trained routed expert model as a folder to share: ``experts.safetensors`` plus ``config.json``.
The folder holds what :meth:`RoutedExpertViT.experts_state_dict` gives (experts, heads,
prototypes, class-router state, class maps), never the backbone: ``config.json`` names the
model class, its options, each expert's classes, the backbone's weights digest and the
package version, and the size and SHA-256 of ``experts.safetensors`` (which holds a copy of the
rest of ``config.json``). Loading refuses a changed, truncated or foreign file, and a
``config.json`` edited since the save, a backbone with another digest, or options that change what
the experts mean, naming every difference; a round trip predicts bit-identically.

``save_pretrained`` records each tensor file's size and SHA-256 in ``config.json`` (``"files"``),
and writes a copy of ``config.json``'s content (all but ``"files"``) into the tensor file's
safetensors metadata, so the recorded SHA-256 covers the options and the experts' records too.
Loading reads the tensor file once, checks the size and then the digest of the bytes it read,
then compares ``config.json`` with the copy the verified file holds (:func:`check_config_unchanged`),
and only then parses the tensors: a file changed in place, truncated, or taken from another
save, and a ``config.json`` edited since the save (an option, an expert's entry dropped or its
classes swapped) are refused, naming the folder, the file and what differs. Folders saved before
the digests (or the copy) were recorded still load, with a warning that they cannot be verified.

The LoRA-sum peers' saved folders and the training checkpoint use the
same verified folder and the same records of the model.
"""

from __future__ import annotations

import copy
import hashlib
import json
import warnings
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save_file
from torch import Tensor, nn

from avalanche_color.utils.files import PathLike, write_folder_atomically
from avalanche_color.utils.state import tensors_digest
from avalanche_color.version import __version__

# A type only: routed_vit imports this module for the model's save and load, and this one names the model in
# its annotations alone (a decision: a Protocol restating the model's interface would serve the type checker
# only, and drift from the class it describes).
if TYPE_CHECKING:
    from avalanche_color.experts.routed_vit import RoutedExpertViT

# --------------------------------------------------------------------------------------------------
# What identifies a routed expert model's learned state, for the checkpoint and the saved folder.
#
# Both formats keep the experts without the backbone, so both record the model's settings,
# a fingerprint of the frozen backbone and Avalanche's bookkeeping on the model.

def model_settings(model: nn.Module) -> dict[str, Any]:
    """The settings of a routed expert model that decide what its experts' weights mean."""
    return {"model": type(model).__name__, **model.config.expert_settings()}


def backbone_fingerprint(model: nn.Module) -> str:
    """A digest of the frozen backbone: every non-expert tensor's name, shape, dtype and bytes.

    Experts are only meaningful on the backbone they were trained on; the files
    keep this digest instead of a copy of the backbone.
    """
    experts = set(model.experts_state_dict())
    return tensors_digest((name, tensor) for name, tensor in model.state_dict().items() if name not in experts)


def model_extras(model: nn.Module) -> dict[str, Any]:
    """Avalanche's per-model bookkeeping that is not in the state_dict."""
    extras: dict[str, Any] = {}
    if hasattr(model, "max_class_label"):
        extras["max_class_label"] = int(model.max_class_label)
    if hasattr(model, "known_train_tasks_labels"):
        extras["known_train_tasks_labels"] = sorted(int(t) for t in model.known_train_tasks_labels)
    return extras


def restore_model_extras(model: nn.Module, extras: dict[str, Any]) -> None:
    """Put back what :func:`model_extras` recorded."""
    if "max_class_label" in extras:
        model.max_class_label = extras["max_class_label"]
    if "known_train_tasks_labels" in extras:
        model.known_train_tasks_labels = set(extras["known_train_tasks_labels"])


# --------------------------------------------------------------------------------------------------
# Reading a stored state into a routed expert model: the expert shapes checked first.
#
# The state of a routed model is the backbone's (never saved), the experts' modules (in their
# slots), the expert bank (heads and records, under ``bank.``) and the router (``router.``).

def stored_expert_classes(state_dict: dict[str, Any], prefix: str) -> list[list[int]]:
    """The classes of each expert a stored state holds (as many as its bank's records say)."""
    experiences = state_dict.get(f"{prefix}bank.experiences")
    count = 0 if experiences is None else len(experiences)
    return [state_dict[f"{prefix}bank.heads.{index}.classes"].tolist() for index in range(count)]


def check_stored_shapes(model: nn.Module, slots: Sequence[nn.ModuleList], new_modules: Sequence[nn.Module],
                        state_dict: dict[str, Any], prefix: str, options: str) -> None:
    """Refuse a stored state whose expert tensors have other shapes than ``model``'s experts,
    naming the tensor and ``options`` (the options that decide the shapes)."""
    names = {id(module): name for name, module in model.named_modules()}
    for slot, module in zip(slots, new_modules, strict=True):
        expected = {name: tuple(tensor.shape) for name, tensor in module.state_dict().items()}
        slot_prefix = f"{prefix}{names[id(slot)]}."
        for key, tensor in state_dict.items():
            if not key.startswith(slot_prefix):
                continue
            name = key[len(slot_prefix):].partition(".")[2]  # the key inside one expert's module
            if name in expected and tuple(tensor.shape) != expected[name]:
                raise ValueError(f"state does not fit this model: {key[len(prefix):]} has shape "
                                 f"{tuple(tensor.shape)}, this model's experts have {expected[name]} "
                                 f"({options}); build the model with the options it was saved with")


# --------------------------------------------------------------------------------------------------
# A saved model folder checked before use: its ``config.json`` and tensor file those it was saved with.

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


# --------------------------------------------------------------------------------------------------
# The routed expert model's own folder: ``save_pretrained`` and ``from_pretrained``.

FORMAT = "avalanche_color.pretrained"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "experts.safetensors"
Model = TypeVar("Model", bound="RoutedExpertViT")


def model_options(model_class: type[RoutedExpertViT], config: Any) -> dict[str, Any]:
    """The model's own options (the fields of its options class), as JSON-ready values."""
    return {name: getattr(config, name) for name in model_class.options_class.names()}


def save_pretrained(model: RoutedExpertViT, folder: PathLike) -> Path:
    """Write ``model``'s experts and ``config.json`` into ``folder``, atomically.

    Both files are written into a new folder beside ``folder`` that then takes its name, so a
    failure leaves no half-written save. ``folder`` may be new, empty or an earlier save;
    a folder holding other files is refused.
    """
    config = {
        "format": FORMAT,
        "version": __version__,
        "model": type(model).__name__,
        "options": model_options(type(model), model.config),
        "experts": [{"classes": head.classes.tolist(), "experience": int(experience), "task": int(task),
                     "finished": bool(finished)}
                    for head, experience, task, finished in zip(model.bank.heads, model.bank.experiences,
                                                                  model.bank.tasks, model.bank.finished)],
        "backbone": {"architecture": getattr(model.backbone, "pretrained_cfg", {}).get("architecture"),
                     "digest": backbone_fingerprint(model)},
        "model_extras": model_extras(model),
    }
    return write_saved_folder(folder, model.experts_state_dict(), config, tensors_file=WEIGHTS_FILE,
                              config_file=CONFIG_FILE)


def from_pretrained(model_class: type[Model], folder: PathLike, backbone: nn.Module, **options: Any) -> Model:
    """A ``model_class`` on a copy of ``backbone`` with the experts of ``folder``, in eval mode.

    ``options`` may change settings that do not decide what the experts mean (e.g.
    ``cache_evaluation``); any other difference from the saved model is refused.
    """
    folder = Path(folder)
    saved = read_saved_folder(folder, tensors_file=WEIGHTS_FILE, config_file=CONFIG_FILE, form=FORMAT,
                              what="an avalanche_color saved model",
                              keys=("model", "options", "backbone", "model_extras"),
                              model_class=model_class.__name__)
    weights = read_verified(folder, WEIGHTS_FILE, saved.get("files"))
    check_config_unchanged(folder, CONFIG_FILE, saved, WEIGHTS_FILE, weights)
    model = model_class(copy.deepcopy(backbone), **{**saved["options"], **options})
    problems = []
    expert_settings = model.config.expert_settings()
    for name, value in sorted(options.items()):
        if name in expert_settings and value != saved["options"].get(name):
            problems.append(f"{name}: saved {saved['options'].get(name)!r}, given {value!r}")
    digest = backbone_fingerprint(model)
    if digest != saved["backbone"]["digest"]:
        problems.append(f"backbone: the experts were trained on another backbone (weights digest "
                        f"{saved['backbone']['digest'][:12]}, this backbone's {digest[:12]})")
    if problems:
        raise ValueError(f"{folder} does not fit: " + "; ".join(problems))
    model.load_experts_state_dict(load_tensors(folder, WEIGHTS_FILE, weights))
    restore_model_extras(model, saved["model_extras"])
    return model.eval()
