"""Saving a trained model as a folder (safetensors + JSON) and loading it onto its backbone."""

import json

import pytest
import torch

from avalanche_color import ExpertViT, PromptExpertViT
from helpers import UNSATURATED, tiny_color, train_all
from streams import class_stream, tiny_vit


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    benchmark = class_stream(num_experiences=3)
    strategy = tiny_color(**UNSATURATED)
    train_all(strategy, benchmark)
    folder = strategy.model.save_pretrained(tmp_path_factory.mktemp("color") / "experts")
    images = torch.cat([torch.stack([s[0] for s in e.dataset]) for e in benchmark.test_stream])
    return strategy.model.eval(), folder, images


def test_round_trip_predicts_bit_identically_and_leaves_the_backbone_given(trained):
    model, folder, images = trained
    vit = tiny_vit()
    before = {k: v.clone() for k, v in vit.state_dict().items()}
    loaded = ExpertViT.from_pretrained(folder, vit)
    assert not loaded.training and loaded.num_experts == 3
    assert torch.equal(loaded(images), model(images))
    assert torch.equal(loaded.route(images), model.route(images))
    assert vit.state_dict().keys() == before.keys() and all(torch.equal(vit.state_dict()[k], v) for k, v in before.items())


def test_the_folder_holds_safetensors_and_a_readable_config(trained):
    model, folder, _ = trained
    config = json.loads((folder / "config.json").read_text())
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "experts.safetensors"]
    assert config["model"] == "ExpertViT" and config["options"]["rank"] == model.rank
    assert [e["classes"] for e in config["experts"]] == [h.classes.tolist() for h in model.bank.heads]
    assert len(config["backbone"]["digest"]) == 32 and config["version"]


def test_another_backbone_is_refused(trained):
    _, folder, _ = trained
    with pytest.raises(ValueError, match="backbone: the experts were trained on another backbone"):
        ExpertViT.from_pretrained(folder, tiny_vit(seed=1))


def test_each_changed_expert_setting_is_named(trained):
    _, folder, _ = trained
    with pytest.raises(ValueError, match=r"distance: saved 'euclidean', given 'cosine'; "
                                         r"routing_features: saved 'backbone', given 'first_expert'"):
        ExpertViT.from_pretrained(folder, tiny_vit(), routing_features="first_expert", distance="cosine")


def test_a_setting_that_keeps_the_experts_meaning_may_change(trained):
    model, folder, images = trained
    loaded = ExpertViT.from_pretrained(folder, tiny_vit(), cache_evaluation=True)
    with torch.no_grad():
        assert torch.equal(loaded(images), model(images))


def test_another_model_class_is_refused(trained):
    _, folder, _ = trained
    with pytest.raises(ValueError, match="holds a saved ExpertViT .*, not a PromptExpertViT"):
        PromptExpertViT.from_pretrained(folder, tiny_vit())


def test_a_folder_without_a_saved_model_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="needs config.json and experts.safetensors"):
        ExpertViT.from_pretrained(tmp_path, tiny_vit())
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "experts.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="not an avalanche_color saved model"):
        ExpertViT.from_pretrained(tmp_path, tiny_vit())


def test_prompt_experts_round_trip_too(tmp_path):
    strategy_model = PromptExpertViT(tiny_vit(), prompt_length=2)
    strategy_model.start_expert([0, 1])
    torch.nn.init.normal_(strategy_model.bank.heads[0].linear.weight)
    strategy_model.finish_expert(0)
    images = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    loaded = PromptExpertViT.from_pretrained(strategy_model.save_pretrained(tmp_path / "p"), tiny_vit())
    assert torch.equal(loaded.predict(images, 0), strategy_model.predict(images, 0))


# ---------------------------------------------------------------------- atomic saving


def saved_files(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_a_failed_save_leaves_the_earlier_one_whole_and_no_temporary_folder(trained, tmp_path, monkeypatch):
    model, _, _ = trained
    folder = model.save_pretrained(tmp_path / "experts")
    before = saved_files(folder)
    other = PromptExpertViT(tiny_vit(), prompt_length=2)
    other.start_expert([0, 1])

    def broken_save_file(tensors, filename, metadata=None):  # dies half-way through the weights
        with open(filename, "wb") as file:
            file.write(b"half")
        raise OSError("disk full")

    monkeypatch.setattr("avalanche_color.experts.saved.save_file", broken_save_file)
    with pytest.raises(OSError, match="disk full"):
        other.save_pretrained(folder)
    assert saved_files(folder) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["experts"]
    with pytest.raises(OSError, match="disk full"):
        other.save_pretrained(tmp_path / "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["experts"]


def test_saving_again_replaces_an_earlier_save_and_refuses_a_folder_with_other_files(trained, tmp_path):
    model, _, images = trained
    first = PromptExpertViT(tiny_vit(), prompt_length=2)
    first.start_expert([0, 1])
    folder = first.save_pretrained(tmp_path / "experts")
    model.save_pretrained(folder)
    assert torch.equal(ExpertViT.from_pretrained(folder, tiny_vit())(images), model(images))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["experts"]
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"holds other files \(readme.txt\)"):
        model.save_pretrained(tmp_path / "notes")
    assert (tmp_path / "notes" / "readme.txt").read_text() == "mine"


# ---------------------------------------------------------------------- verified loading


@pytest.fixture
def copy_of(trained, tmp_path):
    """A fresh copy of the saved folder, to damage."""
    import shutil

    _, folder, _ = trained
    return shutil.copytree(folder, tmp_path / "copy")


def test_the_config_records_each_tensor_files_size_and_sha256(trained):
    import hashlib

    _, folder, _ = trained
    data = (folder / "experts.safetensors").read_bytes()
    recorded = json.loads((folder / "config.json").read_text())["files"]
    assert recorded == {"experts.safetensors": {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}}


def test_bytes_changed_inside_the_weights_are_refused_naming_the_file_and_digests(copy_of):
    from avalanche_color import SavedModelError

    weights = copy_of / "experts.safetensors"
    data = bytearray(weights.read_bytes())
    data[-200:-150] = b"\xff" * 50  # 50 bytes of a tensor: still a valid safetensors file, with NaNs in it
    weights.write_bytes(bytes(data))
    with pytest.raises(SavedModelError, match=r"copy: experts.safetensors is not the file saved with this "
                                              r"config.json: SHA-256 [0-9a-f]{16}\.\.\., recorded [0-9a-f]{16}"):
        ExpertViT.from_pretrained(copy_of, tiny_vit())


def test_a_truncated_weights_file_is_refused_naming_its_size_and_the_recorded_one(copy_of):
    from avalanche_color import SavedModelError

    weights = copy_of / "experts.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(SavedModelError, match=rf"copy: experts.safetensors is 1000 bytes, config.json records "
                                              rf"{size} \(truncated, or another file\)"):
        ExpertViT.from_pretrained(copy_of, tiny_vit())


def test_another_saves_weights_file_is_refused(copy_of, tmp_path):
    from avalanche_color import SavedModelError

    other = tiny_color(**UNSATURATED)
    train_all(other, class_stream(num_experiences=3, seed=1))
    other_folder = other.model.save_pretrained(tmp_path / "other")
    foreign = (other_folder / "experts.safetensors").read_bytes()
    assert len(foreign) == (copy_of / "experts.safetensors").stat().st_size  # same size: only the digest tells
    (copy_of / "experts.safetensors").write_bytes(foreign)
    with pytest.raises(SavedModelError, match="not the file saved with this config.json.*another save's file"):
        ExpertViT.from_pretrained(copy_of, tiny_vit())


def test_a_truncated_config_is_refused_naming_the_folder(copy_of):
    from avalanche_color import SavedModelError

    config = copy_of / "config.json"
    config.write_text(config.read_text()[:100])
    with pytest.raises(SavedModelError, match=r"copy: config.json is not valid JSON \(truncated or damaged\?\)"):
        ExpertViT.from_pretrained(copy_of, tiny_vit())
    config.write_text(json.dumps({"format": "avalanche_color.pretrained", "model": "ExpertViT"}))
    with pytest.raises(SavedModelError, match="config.json lacks options, backbone, model_extras"):
        ExpertViT.from_pretrained(copy_of, tiny_vit())


def test_a_folder_saved_before_digests_loads_with_a_warning(trained, copy_of):
    from avalanche_color import SavedModelError

    model, _, images = trained
    config = json.loads((copy_of / "config.json").read_text())
    del config["files"]
    (copy_of / "config.json").write_text(json.dumps(config))
    with pytest.warns(UserWarning, match=r"copy was saved without file digests .*: experts.safetensors cannot be "
                                         r"verified; save the model again") as warned:
        loaded = ExpertViT.from_pretrained(copy_of, tiny_vit())
    assert warned[0].filename == __file__  # points at the caller's line
    assert torch.equal(loaded(images), model(images))
    weights = copy_of / "experts.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])  # unverifiable, but an unreadable file is still named
    with pytest.warns(UserWarning), pytest.raises(SavedModelError, match=r"copy: experts.safetensors is not a "
                                                                         r"readable safetensors file: Error while"):
        ExpertViT.from_pretrained(copy_of, tiny_vit())


def test_saved_files_have_the_users_usual_permissions(trained, tmp_path):
    import os

    model, _, _ = trained
    previous = os.umask(0o027)
    try:
        folder = model.save_pretrained(tmp_path / "shared")
    finally:
        os.umask(previous)
    assert oct(folder.stat().st_mode & 0o777) == oct(0o750)
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in folder.iterdir()} == {
        "config.json": oct(0o640), "experts.safetensors": oct(0o640)}
