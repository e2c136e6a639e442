"""The forward pass says which expert runs: experts are arguments or return values (``return_experts=True``, which
the strategies' evaluation keeps as ``strategy.mb_routed_experts``); a forward leaves no state on the model."""

import pytest
import torch
from avalanche.core import SupervisedPlugin

from avalanche_color import ExpertViT, LoRAOptions, PromptExpertViT
from helpers import UNSATURATED, quiet_evaluator, tiny_color, train_all
from streams import class_stream, tiny_vit


@pytest.fixture(scope="module")
def trained():
    benchmark = class_stream(num_experiences=3)
    strategy = tiny_color(**UNSATURATED)
    train_all(strategy, benchmark)
    images = torch.cat([torch.stack([s[0] for s in e.dataset]) for e in benchmark.test_stream])
    return strategy, images


def plain_attributes(model: torch.nn.Module) -> dict:
    """Every attribute of the model and its submodules that is not a parameter, buffer or module."""
    return {(name, key): value for name, module in model.named_modules() for key, value in vars(module).items()
            if not key.startswith("_") and key != "training"}


@torch.no_grad()
def test_given_experts_give_the_routed_logits_and_route_and_predict_returns_both(trained):
    strategy, images = trained
    model = strategy.model.eval()
    experts = model.route(images)
    assert len(set(experts.tolist())) == 3  # a mixed batch
    logits, routed = model.route_and_predict(images)
    assert torch.equal(routed, experts)
    assert torch.equal(model(images), logits)
    assert torch.equal(model(images, experts=experts), logits)
    assert torch.equal(model(images, experts=1), model.predict(images, 1))


@torch.no_grad()
def test_given_experts_run_in_train_mode_too_where_routing_refuses(trained):
    strategy, images = trained
    model = strategy.model
    experts = model.eval().route(images)
    expected = model(images)
    model.train()
    try:
        assert torch.equal(model(images, experts=experts), expected)
        with pytest.raises(RuntimeError, match="call model.eval"):
            model(images)
    finally:
        model.eval()


@torch.no_grad()
def test_a_forward_leaves_nothing_behind_and_returns_the_experts_it_routed_to(trained):
    strategy, images = trained
    model = strategy.model.eval()
    logits, routed = model(images[:3], experts=torch.tensor([2, 0, 1]), return_experts=True)
    assert routed is None and torch.equal(logits, model(images[:3], experts=torch.tensor([2, 0, 1])))
    before = plain_attributes(model)
    logits, routed = model(images, return_experts=True)
    assert torch.equal(routed, model.route(images)) and torch.equal(logits, model(images))
    assert torch.equal(logits, model(images, experts=routed))
    assert plain_attributes(model) == before


@pytest.mark.parametrize("experts, message", [
    (3, r"experts must be an index in \[0, 3\) .* got 3"),
    (torch.tensor([0, 1]), r"got a torch.int64 tensor of shape \(2,\)"),
    (torch.tensor([0.0, 1.0, 2.0, 0.0]), r"got a torch.float32 tensor"),
    (torch.tensor([0, 1, 5, 0]), r"got indices \[0, 1, 5\]"),
])
def test_bad_experts_are_refused_naming_what_is_allowed(trained, experts, message):
    strategy, images = trained
    with pytest.raises(ValueError, match=message):
        strategy.model.eval()(images[:4], experts=experts)


class KeepExperts(SupervisedPlugin):
    """Records, after each evaluation forward, the batch and the experts the model routed it to."""

    def __init__(self):
        super().__init__()
        self.batches = []

    def after_eval_forward(self, strategy, **kwargs):
        self.batches.append((strategy.mb_x.clone(), strategy.mb_routed_experts))


@pytest.mark.parametrize("model_class", [ExpertViT, PromptExpertViT])
def test_the_strategys_evaluation_keeps_the_experts_it_routed_with(model_class):
    from avalanche_color import SPrompts

    benchmark = class_stream(num_experiences=2)
    keep = KeepExperts()
    if model_class is ExpertViT:
        strategy = tiny_color(plugins=[keep], **UNSATURATED)
    else:
        strategy = SPrompts(tiny_vit(), k=3, train_epochs=1, train_mb_size=16, eval_mb_size=64, plugins=[keep],
                            evaluator=quiet_evaluator())
    strategy.eval(benchmark.test_stream[:1])
    assert keep.batches and all(experts is None for _, experts in keep.batches)  # no expert yet: nothing routed
    train_all(strategy, benchmark)
    images, experts = keep.batches[-1]
    with torch.no_grad():
        assert torch.equal(experts, strategy.model.eval().route(images))


def test_the_model_is_given_the_strategys_model_options(trained):
    strategy, _ = trained
    assert strategy.model.config == strategy.config.group(LoRAOptions)
    cached = tiny_color(cache_evaluation=True, **UNSATURATED)
    train_all(cached, class_stream(num_experiences=2))
    assert cached.model.config == cached.config.group(LoRAOptions) and cached.model.eval_cache is not None
    assert not hasattr(cached.model, "cache_evaluation")  # the cache is an option, never switched behind the config
