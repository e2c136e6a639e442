"""Bad input: a clear error that names the argument and value, and nothing half-written."""

import warnings

import pytest
import torch
from avalanche.training import Naive
from avalanche.training.templates.base import PositionalArgumentsDeprecatedWarning

from avalanche_color import (L2P, CoLoR, ExpertViT, InfLoRA, L2PViT, LoRAExpertsPlugin, PromptExpertViT,
                             PrototypeRouterPlugin, SDLoRA, SPrompts)
from helpers import quiet_evaluator, stream_metric, tiny_color, train_all
from streams import class_stream, domain_stream, tiny_vit


def test_model_positional_without_avalanche_deprecation_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", PositionalArgumentsDeprecatedWarning)
        warnings.filterwarnings("error", message="Avalanche is transitioning")
        strategy = CoLoR(tiny_vit(), rank=8, k=20)
    assert isinstance(strategy.model, ExpertViT) and strategy.model.rank == 8


def test_a_positional_argument_after_the_model_is_the_config_and_not_taken_for_an_option():
    with pytest.raises(TypeError, match="config must be a CoLoRConfig, got int"):
        CoLoR(tiny_vit(), 8)


@pytest.mark.parametrize("model", [torch.nn.Linear(4, 4), torch.nn.Sequential()])
def test_refuses_a_model_that_is_not_a_vit(model):
    with pytest.raises(TypeError, match="model must be a timm.*VisionTransformer.*got torch.nn.*(Linear|Sequential)"):
        CoLoR(model)


@pytest.mark.parametrize("rank", [0, -1, 2.5, True])
def test_refuses_bad_rank(rank):
    with pytest.raises(ValueError, match=rf"rank must be an integer >= 1, got {rank!r}"):
        CoLoR(tiny_vit(), rank=rank)


@pytest.mark.parametrize("k", [0, -3])
def test_refuses_bad_k(k):
    with pytest.raises(ValueError, match=rf"k must be an integer >= 1, got {k}"):
        CoLoR(tiny_vit(), k=k)


@pytest.mark.parametrize("option, value", [("routing_features", "nearest"), ("distance", "l2"),
                                                   ("prototype_data", "test")])
def test_refuses_unknown_choices(option, value):
    with pytest.raises(ValueError, match=rf"{option} must be one of .*got '{value}'"):
        CoLoR(tiny_vit(), **{option: value})


def test_refuses_k_above_the_experiences_sample_count_before_creating_an_expert():
    strategy = tiny_color(k=41)  # each experience has 2 classes x 20 samples
    with pytest.raises(ValueError, match="k must be at most the experience's sample count: k=41, .* 40 samples"):
        strategy.train(class_stream().train_stream[0])
    assert strategy.model.num_experts == 0


def test_evaluation_before_any_training_is_an_untrained_models():
    # Avalanche evaluates before the first training step (periodic evaluation, forward transfer).
    strategy = tiny_color()
    results = strategy.eval(class_stream().test_stream)
    # No preference among the 4 classes: every sample is predicted as class 0, a quarter of the samples.
    assert stream_metric(results, "Top1_Acc") == pytest.approx(0.25)
    model = ExpertViT(tiny_vit(), rank=2).eval()
    model.max_class_label = 3
    assert torch.equal(model(torch.zeros(2, 3, 16, 16)), torch.zeros(2, 3))


def test_refuses_images_the_backbone_cannot_take_before_creating_an_expert():
    strategy = CoLoR(tiny_vit(img_size=32), rank=2, k=2, train_epochs=1, evaluator=quiet_evaluator())
    with pytest.raises(ValueError, match=r"images must have shape \(batch, 3, 32, 32\), got \(1, 3, 16, 16\)"):
        strategy.train(class_stream().train_stream[0])
    assert strategy.model.num_experts == 0


def test_refuses_images_with_the_wrong_channel_count():
    model = ExpertViT(tiny_vit(), rank=2)
    model.start_expert([0, 1])
    with pytest.raises(ValueError, match=r"images must have shape \(batch, 3, 16, 16\), got \(2, 1, 16, 16\)"):
        model(torch.zeros(2, 1, 16, 16))


def test_refuses_a_state_of_another_rank():
    model = ExpertViT(tiny_vit(), rank=2)
    model.start_expert([0, 1])
    with pytest.raises(ValueError, match=r"backbone.blocks.0.attn.qkv.experts.0.A has shape \(2, 2, 32\), this "
                                         r"model's experts have \(2, 3, 32\) \(rank=3\)"):
        ExpertViT(tiny_vit(), rank=3).load_experts_state_dict(model.experts_state_dict())


def test_every_stored_expert_tensor_is_checked_before_the_model_changes():
    model = ExpertViT(tiny_vit(), rank=2)
    model.start_expert([0, 1])
    model.start_expert([2, 3])
    state = model.experts_state_dict()
    state["backbone.blocks.1.attn.qkv.experts.1.B"] = torch.zeros(2, 32, 5)
    target = ExpertViT(tiny_vit(), rank=2)
    with pytest.raises(ValueError, match=r"backbone.blocks.1.attn.qkv.experts.1.B has shape \(2, 32, 5\)"):
        target.load_experts_state_dict(state)
    assert target.num_experts == 0


def test_never_changes_the_callers_plugin_list():
    plugins = [PrototypeRouterPlugin(k=2)]
    CoLoR(tiny_vit(), plugins=plugins)
    assert len(plugins) == 1


def test_lora_plugin_gives_any_strategy_color_experts():
    vit = tiny_vit()
    strategy = Naive(
        model=vit,
        optimizer=torch.optim.SGD(vit.parameters(), lr=0.02, momentum=0.9),
        train_epochs=8,
        train_mb_size=16,
        evaluator=quiet_evaluator(),
        plugins=[LoRAExpertsPlugin(rank=4), PrototypeRouterPlugin(k=3)],
    )
    results = train_all(strategy, domain_stream())
    assert isinstance(strategy.model, ExpertViT) and strategy.model.num_experts == 2
    assert stream_metric(results, "RoutingAcc") == 1.0
    assert stream_metric(results, "Top1_Acc") > 0.8


def test_a_misspelled_option_is_refused_naming_the_options_and_the_vit_stays_usable():
    vit = tiny_vit()
    with pytest.raises(TypeError, match=r"CoLoR got unexpected keyword arguments \['rnak'\]; its options are .*rank"):
        CoLoR(vit, rnak=8)
    assert CoLoR(vit, rank=8).model.rank == 8  # not adapted by the refused call


@pytest.mark.parametrize("strategy, settings", [
    (CoLoR, "lr, momentum, weight_decay"), (SPrompts, "lr, momentum, weight_decay"), (L2P, "lr"),
    (SDLoRA, "optimizer, lr, momentum, weight_decay, lr_schedule"),
    (InfLoRA, "optimizer, lr, momentum, weight_decay, lr_schedule")])
def test_an_optimizer_is_refused_saying_how_to_set_the_strategys_own(strategy, settings):
    # Naive(model, optimizer=...) is Avalanche's habit; these strategies make an optimiser per experience.
    vit = tiny_vit()
    with pytest.raises(TypeError, match=rf"{strategy.__name__} builds its own optimiser per experience .*"
                                        rf"got SGD; set {settings} instead, or subclass .* override make_optimizer"):
        strategy(vit, optimizer=torch.optim.SGD(vit.parameters(), lr=0.1), evaluator=quiet_evaluator())


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64, torch.bool])
@pytest.mark.parametrize("model_class", [ExpertViT, PromptExpertViT, L2PViT])
def test_refuses_integer_images_naming_the_dtype_and_what_is_expected(model_class, dtype):
    # Converting would need the images' scale (0-255? 0-1?), which a batch does not say.
    model = model_class(tiny_vit())
    model.adaptation(class_stream().train_stream[0])
    images = torch.full((2, 3, 16, 16), 200).to(dtype)
    with pytest.raises(ValueError, match=rf"images must be a floating-point tensor, normalised as the backbone "
                                         rf"expects .*got dtype {dtype}"):
        model(images)
    assert model(images.float()).isfinite().any()  # the same batch as floats runs


def test_a_training_stream_of_integer_images_is_refused_before_an_expert_exists():
    stream = class_stream()
    experience = stream.train_stream[0]
    experience.dataset = experience.dataset.replace_current_transform_group(lambda x: (x * 100).to(torch.uint8))
    strategy = CoLoR(tiny_vit(), rank=2, k=2, train_epochs=1, evaluator=quiet_evaluator())
    with pytest.raises(ValueError, match=r"experience 0, sample 0: images must be a floating-point .*torch.uint8"):
        strategy.train(experience)
    assert strategy.model.num_experts == 0
