"""A trained LoRA-peer model (SD-LoRA, InfLoRA, LoRA subtraction, CL-LoRA) as a folder: ``weights.safetensors``
plus ``config.json``.

The folder holds the model's :meth:`~LoRASumViT.experts_state_dict` (components, magnitudes or
protected subspaces, head, class masks), never the backbone; ``config.json`` names the model
class, its options, a digest of the backbone's weights, and the size and SHA-256 of the weights
file, which holds a copy of the rest of ``config.json``. Loading checks those first (:mod:`~avalanche_color.experts.saved`, as CoLoR's folders:
a changed, truncated or foreign file, or an edited ``config.json``, is a ``SavedModelError`` naming it), builds the model on a
copy of the backbone given, refuses another backbone or class, and predicts bit-identically.
(CoLoR's own format, :mod:`avalanche_color.experts.saved`, is tied to routed experts.)
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from torch import nn

from avalanche_color.experts.saved import (backbone_fingerprint, check_config_unchanged, load_tensors,
                                           read_saved_folder, read_verified, write_saved_folder)
from avalanche_color.utils.files import PathLike
from avalanche_color.version import __version__

FORMAT = "avalanche_color.lora_sum"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "weights.safetensors"
# A LoRA-peer model (a LoRASumViT, or CL-LoRA's model); named here only through what it has, so that this
# module, which the model's save and load methods call, never imports the model.
Model = TypeVar("Model", bound=nn.Module)


def save_folder(model: nn.Module, folder: PathLike) -> Path:
    """Write ``model``'s learned state and ``config.json`` into ``folder``, atomically."""
    config = {"format": FORMAT, "version": __version__, "model": type(model).__name__,
              "options": model.config.as_dict(), "max_class_label": model.max_class_label,
              "backbone": backbone_fingerprint(model)}
    return write_saved_folder(folder, model.experts_state_dict(), config, tensors_file=WEIGHTS_FILE,
                              config_file=CONFIG_FILE)


def load_folder(model_class: type[Model], folder: PathLike, backbone: nn.Module) -> Model:
    """A ``model_class`` on a copy of ``backbone`` with the state saved in ``folder``, in eval mode."""
    folder = Path(folder)
    saved = read_saved_folder(folder, tensors_file=WEIGHTS_FILE, config_file=CONFIG_FILE, form=FORMAT,
                              what="a saved SD-LoRA, InfLoRA, LoRA subtraction or CL-LoRA model",
                              keys=("model", "options", "backbone", "max_class_label", "files"),
                              model_class=model_class.__name__)
    data = read_verified(folder, WEIGHTS_FILE, saved["files"])
    check_config_unchanged(folder, CONFIG_FILE, saved, WEIGHTS_FILE, data)  # before any option is used
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in saved["options"].items()}
    model = model_class(backbone, model_class.config_class.from_saved(options))
    digest = backbone_fingerprint(model)
    if digest != saved["backbone"]:
        raise ValueError(f"{folder} does not fit this backbone: its components were trained on another one "
                         f"(weights digest {saved['backbone'][:12]}, this backbone's {digest[:12]})")
    tensors = load_tensors(folder, WEIGHTS_FILE, data)
    model.load_experts_state_dict({key: value.to(model.device) for key, value in tensors.items()})
    model.max_class_label = max(model.max_class_label, int(saved["max_class_label"]))
    return model.eval()
