"""Backbones load the same way from a checkpoint file, a plain state_dict or the offline name."""

from __future__ import annotations

from pathlib import Path

import pytest
import timm
import torch

from benchmarks.backbones import OFFLINE_BACKBONE, data_config, load_backbone, save_backbone, with_head

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
    config = data_config(loaded)
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
    assert data_config(model)["input_size"] == (3, 32, 32)
    with torch.no_grad():
        assert model(torch.zeros(2, 3, 32, 32)).shape == (2, model.num_features)


def test_with_head_adds_a_fresh_classifier():
    model = with_head(tiny_timm_vit(0), 7)
    assert model(torch.zeros(1, 3, 16, 16)).shape == (1, 7)


def test_the_package_ships_its_small_backbones_and_loads_them_by_name():
    from avalanche_color.backbones import offline_backbone
    from benchmarks.backbones import load_backbone

    for name, size in (("digits", 16), ("offline", 32)):
        vit = offline_backbone(name)
        assert vit.patch_embed.img_size == (size, size) and vit.num_classes == 0 and not vit.training
        same = load_backbone(name)  # the runner's name for it reads the same file
        assert all(torch.equal(a, b) for a, b in zip(vit.state_dict().values(), same.state_dict().values()))
    with pytest.raises(ValueError, match=r"name must be one of \('offline', 'digits'\), got 'cifar'"):
        offline_backbone("cifar")


@pytest.mark.slow
def test_an_installed_package_carries_its_backbones(tmp_path):
    """``pip install`` (here: the wheel it would install) includes the two small ViTs."""
    import subprocess
    import sys
    import zipfile

    repository = Path(__file__).parents[1]
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", str(repository), "--no-deps", "--no-build-isolation",
                            "-w", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    [wheel] = tmp_path.glob("avalanche_color-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for file in ("vit_digits_16px.pt", "vit_tinyimagenet100_32px.pt"):
        assert f"avalanche_color/backbones/{file}" in names
    assert not [name for name in names if name.startswith("benchmarks/")]
