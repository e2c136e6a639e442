"""What a user meets (issue 52): one loader for every saved model, and the same refusals in every strategy.

* ``avalanche_color.load_pretrained(folder, backbone)`` gives back the class that saved the folder, predicting
  exactly as the saved model; each class's ``from_pretrained`` given another class's folder names both classes.
* Every strategy and baseline refuses a device this machine does not have at construction, naming ``device``
  and the value; labels beyond a fixed head (Joint-LoRA's ``num_classes``) are refused before training, naming
  the option, the experience and the labels; the strategies whose heads grow learn every label they are given.
"""

from __future__ import annotations

import re

import pytest
import torch

from avalanche_color import (CLLoRAViT, ExpertViT, InfLoRAViT, LoRASubtractionViT, PromptExpertViT, SavedModelError,
                             SDLoRAViT, load_pretrained)
from avalanche_color.runner.methods import REGISTRY
from registered import build_small, one_method_per_strategy
from streams import class_stream, tiny_vit

pytestmark = pytest.mark.usefixtures("one_thread")

# Every strategy of the package, one method per class (registered.py): the shared checks below.
STRATEGIES = one_method_per_strategy()
SAVED_MODELS = (ExpertViT, PromptExpertViT, SDLoRAViT, InfLoRAViT, LoRASubtractionViT, CLLoRAViT)


@pytest.fixture(scope="module")
def saved_folders(tmp_path_factory):
    """Each saving strategy trained on two experiences, its model and its saved folder."""
    stream = class_stream(num_experiences=2, per_class=6)
    saved = {}
    for name in STRATEGIES:
        strategy = build_small(name)
        if not hasattr(strategy.model, "save_pretrained"):
            continue
        for experience in stream.train_stream:
            strategy.train(experience)
        model = strategy.model.eval()
        saved[name] = (model, model.save_pretrained(tmp_path_factory.mktemp(name) / "saved"))
    return saved


def test_every_saved_model_class_is_one_a_strategy_saves(saved_folders):
    assert {type(model) for model, _ in saved_folders.values()} == set(SAVED_MODELS)


@pytest.mark.parametrize("name", STRATEGIES)
def test_load_pretrained_gives_back_the_class_that_saved_the_folder_predicting_alike(name, saved_folders):
    if name not in saved_folders:
        pytest.skip(f"{name}'s model has no save_pretrained")
    model, folder = saved_folders[name]
    loaded = load_pretrained(folder, tiny_vit(0))
    assert type(loaded) is type(model) and not loaded.training
    images = torch.randn(5, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(loaded(images), model(images))


@pytest.mark.parametrize("name", STRATEGIES)
def test_another_class_s_from_pretrained_names_both_classes(name, saved_folders):
    if name not in saved_folders:
        pytest.skip(f"{name}'s model has no save_pretrained")
    model, folder = saved_folders[name]
    saved_class = type(model).__name__
    for other in SAVED_MODELS:
        if other.__name__ == saved_class:
            continue
        with pytest.raises(SavedModelError, match=rf"holds a saved {saved_class} \(its config.json says so\), not a "
                                                  rf"{other.__name__}: load it with {saved_class}.from_pretrained"):
            other.from_pretrained(folder, tiny_vit(0))


def test_load_pretrained_refuses_a_folder_without_a_saved_model_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=rf"{tmp_path} is not a saved model: it has no config.json"):
        load_pretrained(tmp_path, tiny_vit(0))
    (tmp_path / "config.json").write_text('{"model": "ResNet"}')
    with pytest.raises(SavedModelError, match=r"names model 'ResNet', not one this package saves \(one of \[.*"
                                              r"'ExpertViT'.*'SDLoRAViT'"):
        load_pretrained(tmp_path, tiny_vit(0))


@pytest.mark.parametrize("device", ["cuda", "cuda:7", "tpu", 3.5])
@pytest.mark.parametrize("name", STRATEGIES)
def test_every_strategy_refuses_an_unusable_device_naming_it(name, device):
    if isinstance(device, str) and device.startswith("cuda") and torch.cuda.device_count() > 7:
        pytest.skip("this machine has that CUDA device")
    with pytest.raises(ValueError, match=rf"^device (must be|is not usable).*, got {device!r}$"):
        build_small(name, device=device)


def test_joint_lora_refuses_labels_its_head_cannot_hold_before_training():
    strategy = build_small("Joint-LoRA", num_classes=4)
    before = {k: v.clone() for k, v in strategy.model.state_dict().items()}
    with pytest.raises(ValueError, match=r"num_classes=4 cannot hold the labels of experience 2: its class ids go up "
                                         r"to 5, so num_classes must be at least 6"):
        strategy.train(class_stream(num_experiences=3, per_class=4).train_stream)
    assert all(torch.equal(v, before[k]) for k, v in strategy.model.state_dict().items())


@pytest.mark.parametrize("name", [name for name in STRATEGIES if not REGISTRY[name].joint])  # a joint head is fixed
def test_the_strategies_whose_heads_grow_predict_every_label_they_were_given(name):
    strategy = build_small(name)
    stream = class_stream(num_experiences=3, per_class=4)
    for experience in stream.train_stream:
        strategy.train(experience)
    images = torch.cat([experience.dataset[i][0].unsqueeze(0) for experience in stream.test_stream
                        for i in range(2)])
    with torch.no_grad():
        logits = strategy.model.eval()(images)
    assert logits.shape[1] >= 6  # a column for each of the classes 0..5


@pytest.mark.parametrize("name", STRATEGIES)
def test_what_an_experience_trains_is_counted_or_the_model_asks_for_the_class_count(name):
    """The runner's count of what one experience trains: a model that counts its head rows by the experience's
    classes refuses to count without them, naming num_classes; every other counts alike with or without them."""
    from avalanche_color.runner.run import trainable_parameters_per_experience

    strategy = build_small(name)
    stream = class_stream(num_experiences=1, per_class=4)
    strategy.train(stream.train_stream[0])
    counted = trainable_parameters_per_experience(strategy, stream.train_stream[0])
    assert counted > 0 or not REGISTRY[name].lr_chosen_by  # NCM and RanPAC train nothing by gradient
    try:
        assert trainable_parameters_per_experience(strategy) == counted
    except ValueError as refused:
        assert re.fullmatch(r"num_classes is needed to count what an experience of \w+ trains \(its (proxy )?head "
                            r"rows are its classes'\), got None", str(refused))
