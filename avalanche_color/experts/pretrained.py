"""A trained routed expert model as a folder to share: ``experts.safetensors`` plus ``config.json``.

The folder holds what :meth:`RoutedExpertViT.experts_state_dict` gives (experts, heads,
prototypes, class-router state, class maps), never the backbone: ``config.json`` names the
model class, its options, each expert's classes, the backbone's weights digest and the
package version, and the size and SHA-256 of ``experts.safetensors`` (which holds a copy of the
rest of ``config.json``). Loading refuses a changed, truncated or foreign file, and a
``config.json`` edited since the save (:mod:`~avalanche_color.experts.integrity`), a backbone with another
digest, or options that change what the experts mean, naming every difference; a round trip
predicts bit-identically.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, TypeVar

from torch import nn

from avalanche_color.experts.integrity import (check_config_unchanged, load_tensors, read_saved_folder, read_verified,
                                              write_saved_folder)
from avalanche_color.experts.model_state import backbone_fingerprint, model_extras, restore_model_extras
from avalanche_color.utils.files import PathLike
from avalanche_color.version import __version__


FORMAT = "avalanche_color.pretrained"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "experts.safetensors"
# A routed expert model (experts.routed_vit.RoutedExpertViT); named here only through what it has,
# so that this module, which the model's save and load methods call, never imports the model.
Model = TypeVar("Model", bound=nn.Module)


def model_options(model_class: type[nn.Module], config: Any) -> dict[str, Any]:
    """The model's own options (the fields of its options class), as JSON-ready values."""
    names = model_class.options_class.names()  # type: ignore[attr-defined]
    return {name: getattr(config, name) for name in names}


def save_pretrained(model: nn.Module, folder: PathLike) -> Path:
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
