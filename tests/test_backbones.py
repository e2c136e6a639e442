"""Backbones load the same way from a checkpoint file, a plain state_dict or the offline name."""

from __future__ import annotations

from pathlib import Path

import pytest
import timm
import torch

from avalanche_color import backbone_data_config
from avalanche_color.runner.backbone_loading import OFFLINE_BACKBONE, load_backbone, save_backbone, with_head

TINY = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2)


def tiny_timm_vit(num_classes: int = 5):
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=num_classes, **TINY).eval()


def test_checkpoint_round_trip_gives_the_same_features(tmp_path):
    model = tiny_timm_vit()
    model.pretrained_cfg = {**model.pretrained_cfg, "mean": (0.5,) * 3, "std": (0.25,) * 3}
    save_backbone(model, tmp_path / "vit.pt", architecture="vit_tiny_patch16_224", model_kwargs=TINY)
    loaded = load_backbone(tmp_path / "vit.pt")
    x = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(loaded(x), model.forward_head(model.forward_features(x), pre_logits=True))
    assert loaded.num_classes == 0  # headless: CoLoR and the baselines add their own
    config = backbone_data_config(loaded)
    assert config["input_size"] == (3, 16, 16) and config["mean"] == (0.5,) * 3 and config["std"] == (0.25,) * 3


def test_plain_state_dict_loads_through_timm_with_its_architecture(tmp_path):
    model = tiny_timm_vit()
    torch.save(model.state_dict(), tmp_path / "weights.pth")
    with pytest.raises(ValueError, match="architecture="):
        load_backbone(tmp_path / "weights.pth")
    # timm's pretrained_cfg_overlay route builds the registered shape, so use a registered one.
    full = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=3)
    torch.save(full.state_dict(), tmp_path / "full.pth")
    loaded = load_backbone(tmp_path / "full.pth", architecture="vit_tiny_patch16_224")
    assert torch.equal(loaded.blocks[0].attn.qkv.weight, full.blocks[0].attn.qkv.weight)
    assert loaded.num_classes == 0


def test_bad_backbone_specs_are_refused(tmp_path):
    with pytest.raises(ValueError, match="not_a_model"):
        load_backbone("not_a_model")
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        load_backbone(tmp_path / "missing.pt", architecture="vit_tiny_patch16_224")
    torch.save({"format": 1, "architecture": "resnet18", "model_kwargs": {}, "pretrained_cfg": {},
                "state_dict": timm.create_model("resnet18", num_classes=0).state_dict()}, tmp_path / "cnn.pt")
    with pytest.raises(TypeError, match="not a timm VisionTransformer"):
        load_backbone(tmp_path / "cnn.pt")


def test_offline_backbone_is_committed_and_loads():
    model = load_backbone("offline")
    assert OFFLINE_BACKBONE.stat().st_size < 10 * 2**20
    assert backbone_data_config(model)["input_size"] == (3, 32, 32)
    with torch.no_grad():
        assert model(torch.zeros(2, 3, 32, 32)).shape == (2, model.num_features)


def test_with_head_adds_a_fresh_classifier():
    model = with_head(tiny_timm_vit(0), 7)
    assert model(torch.zeros(1, 3, 16, 16)).shape == (1, 7)


def test_the_package_ships_its_small_backbones_and_loads_them_by_name():
    from avalanche_color.backbones import offline_backbone
    from avalanche_color.runner.backbone_loading import load_backbone

    for name, size in (("digits", 16), ("offline", 32)):
        vit = offline_backbone(name)
        assert vit.patch_embed.img_size == (size, size) and vit.num_classes == 0 and not vit.training
        same = load_backbone(name)  # the runner's name for it reads the same file
        assert all(torch.equal(a, b) for a, b in zip(vit.state_dict().values(), same.state_dict().values()))
    with pytest.raises(ValueError, match=r"name must be one of \('offline', 'digits'\), got 'cifar'"):
        offline_backbone("cifar")


@pytest.mark.slow
def test_an_installed_package_carries_its_backbones(tmp_path):
    """``pip install`` (here: the wheel it would install) includes the two small ViTs and the py.typed marker."""
    import subprocess
    import sys
    import zipfile

    repository = Path(__file__).parents[1]
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", str(repository), "--no-deps", "--no-build-isolation",
                            "-w", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    [wheel] = tmp_path.glob("avalanche_color-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for file in ("backbones/vit_digits_16px.pt", "backbones/vit_tinyimagenet100_32px.pt", "py.typed"):
        assert f"avalanche_color/{file}" in names
    assert not [name for name in names if name.startswith("benchmarks/")]


# --- --backbone: weights files with --architecture, random weights, no network ---------------------


@pytest.fixture(scope="module")
def registered_vit():
    """A timm ViT of a registered shape (a state dict file is built by its architecture's name), seeded."""
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=3).eval()


@pytest.mark.parametrize("file_name, nesting", [("model.safetensors", None), ("pytorch_model.bin", None),
                                                ("weights.pt", "state_dict"), ("ddp.pth", "module.")])
def test_a_timm_state_dict_file_loads_with_its_architecture(file_name, nesting, registered_vit, tmp_path):
    from safetensors.torch import save_file

    state = registered_vit.state_dict()
    path = tmp_path / file_name
    if file_name.endswith(".safetensors"):  # the format of timm's files on the Hugging Face hub
        save_file({key: value.contiguous() for key, value in state.items()}, path)
    elif nesting == "module.":  # a DistributedDataParallel model's state dict
        torch.save({f"module.{key}": value for key, value in state.items()}, path)
    else:
        torch.save({nesting: state} if nesting else state, path)
    loaded = load_backbone(path, architecture="vit_tiny_patch16_224")
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        assert torch.equal(loaded(x), registered_vit.forward_head(registered_vit.forward_features(x), pre_logits=True))
    assert loaded.num_classes == 0 and not loaded.training


def test_a_state_dict_of_another_architecture_or_none_is_refused_naming_the_file(registered_vit, tmp_path):
    torch.save(registered_vit.state_dict(), tmp_path / "tiny.pth")
    with pytest.raises(ValueError, match=r"tiny.pth' does not hold a timm vit_small_patch16_224 state dict: .*"
                                         r"0 unexpected .* of another shape"):
        load_backbone(tmp_path / "tiny.pth", architecture="vit_small_patch16_224")
    with pytest.raises(ValueError, match=r"architecture must be a timm model name .*, got 'vit_nope'"):
        load_backbone(tmp_path / "tiny.pth", architecture="vit_nope")
    with pytest.raises(ValueError, match=r"plain state dict: pass its timm architecture \(--architecture NAME"):
        load_backbone(tmp_path / "tiny.pth")
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(ValueError, match="list.pt' holds no state dict"):
        load_backbone(tmp_path / "list.pt", architecture="vit_tiny_patch16_224")
    with pytest.raises(FileNotFoundError, match="backbone weights file .*missing.safetensors' does not exist"):
        load_backbone(tmp_path / "missing.safetensors")


def test_a_weights_file_at_another_input_size_is_timms_own_model_of_that_size(registered_vit, tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "vit.safetensors"
    save_file({key: value.contiguous() for key, value in registered_vit.state_dict().items()}, path)
    loaded = load_backbone(path, architecture="vit_tiny_patch16_224", image_size=112)
    # timm's own way of loading a local file at another size: the position embedding resampled alike.
    timms = timm.create_model("vit_tiny_patch16_224", pretrained=True, num_classes=0, img_size=112,
                              pretrained_cfg_overlay=dict(file=str(path))).eval()
    x = torch.randn(2, 3, 112, 112)
    with torch.no_grad():
        assert torch.allclose(loaded(x), timms(x), atol=1e-5)
    config = backbone_data_config(loaded)
    assert config["input_size"] == (3, 112, 112) and config["interpolation"] == "bicubic"
    with pytest.raises(ValueError, match=r"image_size must be a positive multiple of the patch size 16 of backbone "
                                         r"'.*vit.safetensors', got 100"):
        load_backbone(path, architecture="vit_tiny_patch16_224", image_size=100)


def test_random_weights_on_request_have_the_architectures_shape_and_normalisation():
    torch.manual_seed(0)
    first = load_backbone("random:vit_tiny_patch16_224.augreg_in21k")
    second = load_backbone("random:vit_tiny_patch16_224.augreg_in21k")
    assert first.embed_dim == 192 and first.num_classes == 0 and len(first.blocks) == 12
    assert not torch.equal(first.blocks[0].attn.qkv.weight, second.blocks[0].attn.qkv.weight)  # drawn, not loaded
    assert backbone_data_config(first)["mean"] == (0.5, 0.5, 0.5)  # the tag's cfg
    with pytest.raises(ValueError, match=r"architecture must be a timm model name .*, got 'vit_nope'"):
        load_backbone("random:vit_nope")


def test_without_network_or_cache_one_line_says_what_to_pass_at_once(tmp_path, monkeypatch, capsys):
    import time

    import huggingface_hub.constants

    import avalanche_color.runner.backbone_loading as backbone_loading
    from avalanche_color.runner.cli import main

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(backbone_loading, "_hub_reachable", lambda endpoint: False)
    start = time.perf_counter()
    with pytest.raises(backbone_loading.BackboneUnavailable) as error:
        load_backbone("vit_tiny_patch16_224.augreg_in21k")
    assert time.perf_counter() - start < 10
    message = str(error.value)
    assert "\n" not in message and "not in the Hugging Face cache" in message and "cannot be reached" in message
    assert "--backbone FILE --architecture vit_tiny_patch16_224.augreg_in21k" in message
    assert "--backbone random:vit_tiny_patch16_224.augreg_in21k" in message
    assert huggingface_hub.constants.HF_HUB_OFFLINE is False  # put back
    with pytest.raises(SystemExit) as exit_:
        main(["compare", "--benchmark", "digits_class", "--backbone", "vit_tiny_patch16_224.augreg_in21k",
              "--loggers", "--out-dir", str(tmp_path / "runs")])
    assert str(exit_.value) == ("avalanche-color compare: error: --backbone vit_tiny_patch16_224.augreg_in21k: "
                                f"{message}")
    assert not (tmp_path / "runs").exists()  # refused before the output folder is made
