"""Issue 39, point 3: a saved folder's integrity covers config.json (the options and the experts' records).

Each edit a user might make to config.json (an option, an expert's entry dropped, two experts'
classes swapped, the rank) is refused on loading, naming the folder, the file and what differs;
an untouched folder still loads bit-identically.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from avalanche_color import ExpertViT, SavedModelError, SDLoRA, SDLoRAViT
from helpers import UNSATURATED, tiny_color, train_all
from streams import class_stream, tiny_vit

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    strategy = tiny_color(**UNSATURATED)
    train_all(strategy, class_stream(num_experiences=2, per_class=6))
    return strategy.model.eval(), strategy.model.save_pretrained(tmp_path_factory.mktemp("color") / "experts")


def edited(folder, tmp_path, edit):
    copy = shutil.copytree(folder, tmp_path / "copy")
    config = json.loads((copy / "config.json").read_text())
    edit(config)
    (copy / "config.json").write_text(json.dumps(config, indent=2))
    return copy


def swap_classes(config):
    first, second = config["experts"][:2]
    first["classes"], second["classes"] = second["classes"], first["classes"]


EDITS = {
    "alpha": (lambda c: c["options"].update(alpha=40.0), r"options\.alpha: saved None, found 40\.0"),
    "rank": (lambda c: c["options"].update(rank=8), r"options\.rank: saved 4, found 8"),
    "expert dropped": (lambda c: c["experts"].pop(), r"experts: saved 2 entries, found 1"),
    "classes swapped": (swap_classes, r"experts\[0\]\.classes: saved \[0, 1\], found \[2, 3\]; "
                                      r"experts\[1\]\.classes: saved \[2, 3\], found \[0, 1\]"),
}


@pytest.mark.parametrize("edit", EDITS)
def test_an_edited_config_is_refused_naming_the_folder_the_file_and_what_differs(saved, tmp_path, edit):
    _, folder = saved
    change, difference = EDITS[edit]
    copy = edited(folder, tmp_path, change)
    with pytest.raises(SavedModelError, match=rf"{copy}: config\.json is not the one saved with experts\.safetensors "
                                              rf"\(changed since the save\): {difference}"):
        ExpertViT.from_pretrained(copy, tiny_vit())


def test_an_untouched_folder_loads_and_predicts_as_saved(saved, tmp_path):
    model, folder = saved
    copy = shutil.copytree(folder, tmp_path / "copy")
    images = torch.randn(5, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(ExpertViT.from_pretrained(copy, tiny_vit())(images), model(images))


def test_sd_lora_folders_verify_their_config_too(tmp_path):
    strategy = SDLoRA(model=tiny_vit(0), rank=2, train_epochs=1, train_mb_size=8, lr=0.05)
    train_all(strategy, class_stream(num_experiences=1, per_class=6))
    folder = strategy.model.save_pretrained(tmp_path / "sd")
    SDLoRAViT.from_pretrained(folder, tiny_vit(0))
    copy = edited(folder, tmp_path, lambda c: c["options"].update(rank=3))
    with pytest.raises(SavedModelError, match=r"config\.json is not the one saved with weights\.safetensors "
                                              r"\(changed since the save\): options\.rank: saved 2, found 3"):
        SDLoRAViT.from_pretrained(copy, tiny_vit(0))
