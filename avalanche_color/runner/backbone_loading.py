"""One way to get a backbone: a timm name, a weights file, random weights, or the offline backbones.

    load_backbone("vit_base_patch16_224.augreg_in21k")       # timm, pretrained (the Hugging Face cache or hub)
    load_backbone("path/to/checkpoint.pt")                   # a file written by save_backbone
    load_backbone("path/to/model.safetensors", architecture="vit_base_patch16_224")  # a plain state dict
    load_backbone("random:vit_base_patch16_224")             # the architecture with random weights
    load_backbone("offline")                                 # the package's Tiny-ImageNet-100 ViT
    load_backbone("digits")                                  # the package's digits ViT (the main job's)
    load_backbone("vit_tiny_patch16_224", image_size=112)   # any of these at another input size

``image_size`` builds the ViT for square inputs of that side: its position embedding is
resampled from the pretrained grid (timm's ``set_input_size``, bicubic), and
:func:`~avalanche_color.backbone_data_config` then gives that input size, so the streams are made at it.

A weights file named without a folder that is not in the current folder is looked for in the
folder the ``AVALANCHE_COLOR_MODELS`` environment variable names (as ``AVALANCHE_COLOR_DATA`` holds
the data sets), so a command can name the file alone::

    AVALANCHE_COLOR_MODELS=~/weights avalanche-color compare --backbone vit_tiny_patch16_224.safetensors \
        --architecture vit_tiny_patch16_224 ...

A plain state dict is a timm ViT's (as timm's own files on the Hugging Face hub hold it,
``model.safetensors`` or ``pytorch_model.bin``, or as ``torch.save(model.state_dict())`` writes
it: .pth/.pt/.bin/.safetensors; nested under ``"state_dict"`` or ``"model"`` too). Where the
hub cannot be reached and the weights are not in its cache, :class:`BackboneUnavailable` says
in one line what to pass instead, at once rather than after the hub's retries.

The two small ViTs ship with the package (:mod:`avalanche_color.backbones`); the repository's
``benchmarks/pretraining/`` makes them.

Every backbone comes without a classifier head (``num_classes=0``): CoLoR adds its own heads
and the baselines get theirs from :func:`with_head`. The input size and normalisation the backbone
was pretrained with come from timm's ``pretrained_cfg``: :func:`avalanche_color.backbone_data_config`.
"""

from __future__ import annotations

import os
import pickle
import re
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import timm
import torch
from safetensors.torch import load_file as load_safetensors
from timm.models.vision_transformer import VisionTransformer, checkpoint_filter_fn
from torch import nn

from avalanche_color.backbones import FILES, backbone_from_checkpoint, is_backbone_checkpoint, save_backbone

# The small backbones ship with the package (avalanche_color/backbones/).
OFFLINE_BACKBONE, DIGITS_BACKBONE = FILES["offline"], FILES["digits"]
SHIPPED = {"offline": OFFLINE_BACKBONE, "digits": DIGITS_BACKBONE}
__all__ = ["DIGITS_BACKBONE", "OFFLINE_BACKBONE", "SHIPPED", "BackboneUnavailable", "load_backbone",
           "save_backbone", "with_head"]


RANDOM = "random:"  # the prefix of a timm name for random weights
MODELS_ENV = "AVALANCHE_COLOR_MODELS"  # a folder of weights files named by --backbone without a folder
WEIGHTS_SUFFIXES = (".pth", ".pt", ".bin", ".safetensors")
PROBE_SECONDS = 3.0  # how long to wait for the Hugging Face hub before going by its cache alone


class BackboneUnavailable(ValueError):
    """Pretrained weights that can be neither found in the Hugging Face cache nor downloaded."""


def load_backbone(spec: str | Path, *, architecture: str | None = None,
                  image_size: int | None = None) -> VisionTransformer:
    """A headless timm ViT from a timm name, a weights file, ``random:<timm name>`` or an offline name
    (see the module doc); ``architecture`` (a timm name) builds a plain state dict file; ``image_size``
    (None: the backbone's own) the input side it is resized to."""
    backbone = _load(spec, architecture)
    if image_size is not None:
        resize_input(backbone, image_size, str(spec))
    return backbone


def resize_input(backbone: VisionTransformer, image_size: int, origin: str) -> None:
    """Builds ``backbone`` for square ``image_size`` inputs (a multiple of its patch size)."""
    problem = input_size_problem(backbone, image_size, origin)
    if problem:
        raise ValueError(f"image_size {problem}, got {image_size!r}")
    if tuple(backbone.patch_embed.img_size) != (image_size, image_size):
        backbone.set_input_size(img_size=(image_size, image_size))


def input_size_problem(backbone: VisionTransformer, image_size: object, origin: str) -> str | None:
    """What is wrong with ``image_size`` as ``backbone``'s input side (None: nothing)."""
    patch = backbone.patch_embed.patch_size[0]
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < patch or image_size % patch:
        return f"must be a positive multiple of the patch size {patch} of backbone {origin!r}"
    return None


def _load(spec: str | Path, architecture: str | None) -> VisionTransformer:
    shipped = SHIPPED.get(str(spec))
    path = shipped or weights_file(spec) or Path(spec)
    if shipped is not None and not path.is_file():
        raise FileNotFoundError(f"the {spec} backbone {str(path)!r} is missing: reinstall avalanche-color")
    if path.is_file():
        return _from_file(path, architecture)
    if architecture is not None or path.suffix in WEIGHTS_SUFFIXES:
        where = f" (nor in {MODELS_ENV}={os.environ[MODELS_ENV]!r})" if os.environ.get(MODELS_ENV) else ""
        raise FileNotFoundError(f"backbone weights file {str(spec)!r} does not exist{where}")
    name = str(spec)
    if name.startswith(RANDOM):
        return _vit(_create(name[len(RANDOM):], pretrained=False), name)
    if name not in timm.list_models(pretrained=True):
        raise ValueError(f"backbone must be a weights file, 'offline', 'digits', a pretrained timm model name or "
                         f"'{RANDOM}<timm name>' for random weights; got {name!r}")
    return _vit(_pretrained(name), name)


def weights_file(spec: str | Path) -> Path | None:
    """The weights file ``spec`` names: a file path, or a bare file name in the ``AVALANCHE_COLOR_MODELS``
    folder; None where it names no file (a timm name, an offline name, a missing file)."""
    path = Path(spec)
    if str(spec) in SHIPPED:
        return None
    if path.is_file():
        return path
    folder = os.environ.get(MODELS_ENV)
    if folder and path.name == str(spec) and (Path(folder).expanduser() / path).is_file():
        return Path(folder).expanduser() / path
    return None


def _create(architecture: str, *, pretrained: bool) -> nn.Module:
    if not timm.is_model(architecture):
        raise ValueError(f"architecture must be a timm model name (timm.list_models('vit_*') lists the ViTs), "
                         f"got {architecture!r}")
    return timm.create_model(architecture, pretrained=pretrained, num_classes=0)


def _pretrained(name: str) -> nn.Module:
    """timm's pretrained model, from the Hugging Face cache alone where the hub cannot be reached."""
    from huggingface_hub import constants

    reachable = not constants.HF_HUB_OFFLINE and _hub_reachable(constants.ENDPOINT)
    offline = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = offline or not reachable  # read at each request: no retries against no network
    try:
        return timm.create_model(name, pretrained=True, num_classes=0)
    except OSError as error:  # the hub's errors (not cached, offline, HTTP) are all OSErrors
        where = "the Hugging Face hub could not give them" if reachable else f"{constants.ENDPOINT} cannot be reached"
        raise BackboneUnavailable(
            f"backbone {name!r}: its pretrained weights are not in the Hugging Face cache and {where} "
            f"({type(error).__name__}); pass a weights file (--backbone FILE --architecture {name}), "
            f"random weights (--backbone {RANDOM}{name}), or run where the hub is reachable") from None
    finally:
        constants.HF_HUB_OFFLINE = offline


def _hub_reachable(endpoint: str) -> bool:
    """Whether a connection to the hub opens within :data:`PROBE_SECONDS` (assumed so behind a proxy)."""
    if any(os.environ.get(proxy) for proxy in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    url = urlparse(endpoint)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=PROBE_SECONDS).close()
    except OSError:
        return False
    return True


WEIGHTS_KINDS = ("a file save_backbone wrote, or a timm state dict (.pth/.pt/.bin/.safetensors) with "
                 "--architecture NAME")


def _read_weights(path: Path) -> Any:
    """What the weights file ``path`` holds; a file that is not one is refused in one line (:class:`ValueError`),
    not with the reader's own pages of advice."""
    if path.suffix == ".safetensors":
        try:
            return load_safetensors(path)
        except Exception as error:  # noqa: BLE001 (safetensors' Rust errors share no base but Exception)
            raise ValueError(f"{str(path)!r} is not a readable safetensors file ({_first_line(error)}): give "
                             f"{WEIGHTS_KINDS}") from None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, UnicodeDecodeError) as error:
        with path.open("rb") as file:
            start = file.read(4)
        if start.startswith(b"PK") or start.startswith(b"\x80"):  # a torch.save archive (or an old pickle)
            raise ValueError(f"{str(path)!r} holds more than weights (objects torch.load(weights_only=True) does not "
                             f"load, for safety: {_first_line(error)}); save the model's state_dict() or use "
                             f"save_backbone, and give {WEIGHTS_KINDS}") from None
        raise ValueError(f"{str(path)!r} is not a weights file (torch.load cannot read it): give "
                         f"{WEIGHTS_KINDS}") from None


def _first_line(error: BaseException) -> str:
    """An error's message up to its first full stop or line break, without terminal colour codes."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip()
    return re.split(r"(?<=\.)\s|\n", text, maxsplit=1)[0].rstrip(".") or type(error).__name__


def _from_file(path: Path, architecture: str | None) -> VisionTransformer:
    checkpoint = _read_weights(path)
    if path.suffix != ".safetensors":
        if is_backbone_checkpoint(checkpoint):
            return _vit(backbone_from_checkpoint(checkpoint), str(path))
    if architecture is None:
        raise ValueError(f"{str(path)!r} is a plain state dict: pass its timm architecture (--architecture NAME, "
                         f"architecture= in load_backbone), e.g. vit_base_patch16_224")
    model = _vit(_create(architecture, pretrained=False), architecture)
    state = _state_dict(checkpoint, path)
    state = {key: value for key, value in checkpoint_filter_fn(state, model).items() if not key.startswith("head.")}
    expected = model.state_dict()
    missing = [key for key in expected if key not in state]
    unexpected = [key for key in state if key not in expected]
    reshaped = [key for key in state if key in expected and state[key].shape != expected[key].shape]
    if missing or unexpected or reshaped:
        raise ValueError(f"{str(path)!r} does not hold a timm {architecture} state dict: {len(missing)} weights "
                         f"missing (e.g. {missing[:3]}), {len(unexpected)} unexpected (e.g. {unexpected[:3]}), "
                         f"{len(reshaped)} of another shape (e.g. {reshaped[:3]})")
    model.load_state_dict(state)
    return model


def _state_dict(checkpoint: Any, path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a state dict file, unwrapped from ``"state_dict"``/``"model"`` and a DDP ``module.`` prefix."""
    for key in ("state_dict", "model"):
        if isinstance(checkpoint, dict) and isinstance(checkpoint.get(key), dict):
            checkpoint = checkpoint[key]
    if not isinstance(checkpoint, dict) or not all(isinstance(v, torch.Tensor) for v in checkpoint.values()):
        raise ValueError(f"{str(path)!r} holds no state dict (a mapping of names to tensors)")
    return {key.removeprefix("module."): value for key, value in checkpoint.items()}


def _vit(model: nn.Module, origin: str) -> VisionTransformer:
    if not isinstance(model, VisionTransformer):
        raise TypeError(f"backbone {origin!r} is a {type(model).__name__}, not a timm VisionTransformer")
    return model.eval()


def with_head(backbone: VisionTransformer, num_classes: int) -> VisionTransformer:
    """The backbone with a fresh linear classifier over ``num_classes`` (for the baselines)."""
    backbone.reset_classifier(num_classes)
    return backbone
