"""A backbone carries its preprocessing (timm's pretrained_cfg), and the package's transform follows it."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from sklearn.datasets import load_digits
from timm.data import create_transform, resolve_data_config

from avalanche_color import backbone_data_config, backbone_transform
from avalanche_color.backbones import offline_backbone, read_backbone, save_backbone
from avalanche_color.utils.state import tensors_digest
from avalanche_color.benchmarks.digits import digits_split, normalise  # the runner's digits preprocessing, read only

TINY = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2)


def raw_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's 8x8 digits as a user has them: grey, in [0, 1] (the raw values are 0-16)."""
    digits = load_digits()
    return torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16, torch.tensor(digits.target)


def as_multiset(images: torch.Tensor, labels: torch.Tensor) -> Counter:
    return Counter((image.numpy().tobytes(), int(label)) for image, label in zip(images, labels))


def test_a_raw_digit_through_the_package_transform_is_what_the_runner_feeds_the_backbone():
    images, labels = raw_digits()
    transform = backbone_transform(offline_backbone("digits"))
    ours = transform(images)
    split = digits_split(0)
    runner_images = normalise(torch.cat([split.pretrain[0], split.train[0], split.test[0]]))
    runner_labels = torch.cat([split.pretrain[1], split.train[1], split.test[1]])
    assert ours.shape == runner_images.shape == (len(labels), 3, 16, 16) and ours.dtype == runner_images.dtype
    assert as_multiset(ours, labels) == as_multiset(runner_images, runner_labels)  # every image bit-identical
    assert torch.equal(transform(images[7]), ours[7])  # one image as a batch of them
    # What a user guessed before (nearest-neighbour upsampling) is not what the backbone was pretrained on.
    nearest = images.mul(2).sub(1).repeat_interleave(2, 2).repeat_interleave(2, 3).expand(-1, 3, -1, -1)
    assert not as_multiset(nearest, labels) & as_multiset(runner_images, runner_labels)


def test_the_offline_backbone_transform_matches_the_offline_streams_evaluation():
    from avalanche_color.benchmarks.transforms import vit_transforms  # the runner's, read only

    vit = offline_backbone("offline")
    config = backbone_data_config(vit)
    _, runner = vit_transforms(32, config["mean"], config["std"])
    images = torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    ours = backbone_transform(vit)(images)
    expected = torch.stack([runner(image) for image in images])
    assert ours.shape == expected.shape and torch.allclose(ours, expected, rtol=0, atol=1e-6)


def test_the_shipped_backbones_keep_their_weights_and_carry_their_preprocessing():
    for name, size, digest in (("digits", 16, "422249ef6d9d98b860fb04fe"), ("offline", 32, "2334ff04f4c584cd925c9b5c")):
        vit = offline_backbone(name)
        assert tensors_digest(vit.state_dict().items(), digest_size=12) == digest
        assert {key: vit.pretrained_cfg[key] for key in ("input_size", "interpolation", "mean", "std", "crop_pct",
                                                          "crop_mode")} == {
            "input_size": (3, size, size), "interpolation": "bilinear", "mean": (0.5,) * 3, "std": (0.5,) * 3,
            "crop_pct": 1.0, "crop_mode": "center"}
        assert backbone_data_config(vit) == resolve_data_config(model=vit)  # timm reads it as its own


def test_a_timm_pretrained_name_backbone_is_prepared_as_timm_prepares_it():
    # The architecture of a pretrained tag, with random weights: its pretrained_cfg is timm's (no download).
    vit = timm.create_model("vit_tiny_patch16_224.augreg_in21k", pretrained=False, num_classes=0)
    config = backbone_data_config(vit)
    assert config == resolve_data_config(model=vit)
    assert config["interpolation"] == "bicubic" and config["crop_pct"] == 0.9 and config["mean"] == (0.5,) * 3
    photo = Image.fromarray(np.random.default_rng(0).integers(0, 256, (300, 260, 3), dtype=np.uint8))
    ours = backbone_transform(vit)(photo)
    assert ours.shape == (3, 224, 224)
    assert torch.equal(ours, create_transform(**resolve_data_config(model=vit))(photo))
    grey = photo.convert("L")  # made RGB first, as timm's users do with Image.convert("RGB")
    assert torch.equal(backbone_transform(vit)(grey), create_transform(**config)(grey.convert("RGB")))
    resized = timm.create_model("vit_tiny_patch16_224.augreg_in21k", pretrained=False, num_classes=0, img_size=64)
    assert backbone_data_config(resized)["input_size"] == (3, 64, 64)  # the model's own, not its architecture's
    assert backbone_transform(resized)(photo).shape == (3, 64, 64)


def test_training_transform_augments_at_the_input_size_and_options_reach_timm():
    vit = offline_backbone("digits")
    images, _ = raw_digits()
    torch.manual_seed(0)
    train = backbone_transform(vit, train=True, hflip=0.0, color_jitter=None)
    augmented = torch.stack([train(image) for image in images[:8]])
    assert augmented.shape == (8, 3, 16, 16) and not torch.equal(augmented, backbone_transform(vit)(images[:8]))
    assert "RandomHorizontalFlip" not in repr(train) and "RandomResizedCrop" in repr(train)
    assert "Resize(size=16, interpolation=nearest" in repr(backbone_transform(vit, interpolation="nearest"))


def test_bad_images_are_refused_by_shape():
    transform = backbone_transform(offline_backbone("digits"))
    with pytest.raises(ValueError, match=r"takes 3-channel images \(or 1-channel, repeated\), got 2 channels"):
        transform(torch.zeros(2, 8, 8))
    with pytest.raises(ValueError, match=r"must be \(C, H, W\) or \(N, C, H, W\), got shape \(8, 8\)"):
        transform(torch.zeros(8, 8))
    assert torch.equal(transform(torch.full((1, 8, 8), 255, dtype=torch.uint8)), torch.ones(3, 16, 16))


def tiny_vit_with(**cfg) -> timm.models.VisionTransformer:
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, **TINY).eval()
    model.pretrained_cfg = {**model.pretrained_cfg, **cfg}
    return model


def test_a_saved_backbone_keeps_its_preprocessing_and_a_json_beside_it_takes_precedence(tmp_path):
    model = tiny_vit_with(mean=(0.5,) * 3, std=(0.25,) * 3, interpolation="bilinear", crop_pct=1.0)
    save_backbone(model, tmp_path / "vit.pt", architecture="vit_tiny_patch16_224", model_kwargs=TINY)
    loaded = read_backbone(tmp_path / "vit.pt")
    assert backbone_data_config(loaded) == {"input_size": (3, 16, 16), "interpolation": "bilinear",
                                            "mean": (0.5,) * 3, "std": (0.25,) * 3, "crop_pct": 1.0,
                                            "crop_mode": "center"}
    (tmp_path / "vit.json").write_text(json.dumps({"pretrained_cfg": {"interpolation": "nearest", "crop_pct": 0.5},
                                                   "notes": "anything else is left alone"}))
    beside = read_backbone(tmp_path / "vit.pt")
    assert beside.pretrained_cfg["interpolation"] == "nearest" and beside.pretrained_cfg["crop_pct"] == 0.5
    assert beside.pretrained_cfg["std"] == (0.25,) * 3
    assert all(torch.equal(a, b) for a, b in zip(beside.state_dict().values(), model.state_dict().values()))


@pytest.mark.parametrize("cfg, message", [
    ({"interpolation": "cubic"}, r"interpolation must be one of \('nearest', 'bilinear', .*got 'cubic'"),
    ({"input_size": [3, 16]}, r"input_size must be 3 positive ints \(channels, height, width\), got \[3, 16\]"),
    ({"input_size": [3, 16, 16], "mean": [0.5]}, r"mean must be one number per input channel \(3\), got \[0.5\]"),
    ({"std": [0.5, 0, 0.5]}, r"std must be positive for every channel"),
    ({"crop_pct": 1.5}, r"crop_pct must be a number in \(0, 1\], got 1.5"),
    ({"crop_mode": "middle"}, r"crop_mode must be one of \('center', 'squash', 'border'\), got 'middle'"),
])
def test_bad_preprocessing_beside_a_backbone_is_refused_naming_the_file(tmp_path, cfg, message):
    save_backbone(tiny_vit_with(), tmp_path / "vit.pt", architecture="vit_tiny_patch16_224", model_kwargs=TINY)
    (tmp_path / "vit.json").write_text(json.dumps({"pretrained_cfg": cfg}))
    with pytest.raises(ValueError, match=f"vit.json: {message}"):
        read_backbone(tmp_path / "vit.pt")


def test_an_unreadable_json_beside_a_backbone_is_refused_naming_it(tmp_path):
    save_backbone(tiny_vit_with(), tmp_path / "vit.pt", architecture="vit_tiny_patch16_224", model_kwargs=TINY)
    (tmp_path / "vit.json").write_text('{"pretrained_cfg": {"interpolation": ')
    with pytest.raises(ValueError, match=r"vit.json' cannot be read as JSON: Expecting value"):
        read_backbone(tmp_path / "vit.pt")
