"""Prompt tokens in a timm ViT, and S-Prompts: CoLoR's routing and training with prompt experts."""

import pytest
import torch
from avalanche.core import SupervisedPlugin

from avalanche_color import ExpertViT, PromptExpertViT, PrototypeRouterPlugin, SPrompts
from avalanche_color.peers.prompts import insert_prompts, prompted_features, prompted_tokens
from helpers import quiet_evaluator, stream_metric, tiny_color, train_all
from streams import class_stream, domain_stream, tiny_vit

# timm ViT variants: prefix tokens ([CLS], registers, none) and pooling differ.
VIT_VARIANTS = {
    "cls-token": {},
    "registers-avg-pool": dict(reg_tokens=2, global_pool="avg"),
    "no-embed-class": dict(no_embed_class=True),
    "no-cls-token": dict(class_token=False, global_pool="avg"),
}


def images(count=6, seed=0, size=16):
    return torch.randn(count, 3, size, size, generator=torch.Generator().manual_seed(seed))


def tiny_s_prompts(seed=0, **options):
    settings = dict(prompt_length=4, k=3, lr=0.05, train_epochs=8, train_mb_size=16, eval_mb_size=64)
    settings.update(options)
    return SPrompts(tiny_vit(seed), evaluator=quiet_evaluator(), **settings)


# ---------------------------------------------------------------------- prompt tokens


@pytest.mark.parametrize("variant", VIT_VARIANTS.values(), ids=VIT_VARIANTS.keys())
@torch.no_grad()
def test_zero_length_prompts_reproduce_the_backbone(variant):
    vit = tiny_vit(**variant).eval()
    x = images()
    no_prompts = torch.empty(0, vit.embed_dim)
    assert torch.equal(prompted_tokens(vit, x, no_prompts), vit.forward_features(x))
    assert torch.equal(prompted_features(vit, x, no_prompts), vit.forward_head(vit.forward_features(x), pre_logits=True))



@pytest.mark.parametrize("variant", VIT_VARIANTS.values(), ids=VIT_VARIANTS.keys())
@torch.no_grad()
def test_prompts_enter_only_as_tokens_behind_the_prefix_tokens(variant):
    vit = tiny_vit(**variant).eval()
    x = images()
    prompts = torch.randn(3, vit.embed_dim, generator=torch.Generator().manual_seed(1))
    seen = []
    hook = vit.blocks[0].register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    vit.forward_features(x)
    prompted_tokens(vit, x, prompts)
    hook.remove()
    plain, prompted = seen
    prefix = vit.num_prefix_tokens
    # The image tokens the blocks see are the backbone's; the prompts sit behind the prefix, unchanged.
    assert torch.equal(prompted[:, :prefix], plain[:, :prefix])
    assert torch.equal(prompted[:, prefix : prefix + 3], prompts.expand(len(x), -1, -1))
    assert torch.equal(prompted[:, prefix + 3 :], plain[:, prefix:])
    # ... and through attention they change the output.
    features = vit.forward_head(vit.forward_features(x), pre_logits=True)
    assert not torch.allclose(prompted_features(vit, x, prompts), features)


@torch.no_grad()
def test_each_sample_of_a_mixed_batch_sees_only_its_own_experts_prompts():
    model = PromptExpertViT(tiny_vit(), prompt_length=3)
    for classes in ([0, 1], [2, 3], [4, 5]):
        model.start_expert(classes)
        model.prompts[-1].tokens.normal_()
    x = images(9)
    experts = torch.tensor([2, 0, 1, 1, 0, 2, 0, 1, 2])
    mixed = model.predict(x, experts)
    for row, expert in enumerate(experts.tolist()):
        torch.testing.assert_close(mixed[row], model.predict(x[row : row + 1], expert)[0])
    assert len(set(mixed.argmax(1).tolist()) - {0, 1, 2, 3, 4, 5}) == 0


def test_prompts_of_the_wrong_width_are_refused():
    with pytest.raises(ValueError, match=r"prompts must have shape \(count, 32\) or \(2, count, 32\), got \(4, 16\)"):
        insert_prompts(torch.zeros(2, 5, 32), torch.zeros(4, 16), 1)


# ---------------------------------------------------------------------- S-Prompts: shared routing


@torch.no_grad()
@pytest.mark.parametrize("distance", ["euclidean", "l1"])
def test_s_prompts_and_color_route_identically_given_the_same_prototypes_and_distance(distance):
    color = ExpertViT(tiny_vit(), rank=2, distance=distance)
    s_prompts = PromptExpertViT(tiny_vit(), prompt_length=4, distance=distance)
    x = images(32)
    backbone = torch.nn.functional.normalize(color.features(x), dim=-1)
    prototypes = backbone[:9]  # samples 0..8 are prototypes: expert e owns samples 3e..3e+2
    for model in (color, s_prompts):
        for expert in range(3):
            model.start_expert([2 * expert, 2 * expert + 1])
            model.router.set_prototypes(expert, prototypes[3 * expert : 3 * expert + 3])
    routed = color.route(x)
    assert torch.equal(s_prompts.route(x), routed)
    assert routed[:9].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]  # each prototype's own sample goes to its owner
    assert torch.equal(routed, color.router(backbone))


def test_s_prompts_routes_by_l1_as_its_code_and_color_by_euclidean_as_its_authors_renate_code():
    assert PromptExpertViT(tiny_vit(), prompt_length=4).router.distance == "l1"
    assert tiny_s_prompts().config.distance == "l1"
    assert ExpertViT(tiny_vit(), rank=2).router.distance == "euclidean"


def test_s_prompts_and_color_fit_the_same_prototypes_with_the_same_plugin():
    benchmark = class_stream(num_experiences=3)
    color = tiny_color(k=3, train_epochs=1, prototype_data="eval")
    s_prompts = tiny_s_prompts(k=3, train_epochs=1, prototype_data="eval")
    assert any(isinstance(plugin, PrototypeRouterPlugin) for plugin in s_prompts.plugins)
    for experience in benchmark.train_stream:
        color.train(experience)
        s_prompts.train(experience)
    assert torch.equal(s_prompts.model.router.prototypes, color.model.router.prototypes)
    assert torch.equal(s_prompts.model.router.owners, color.model.router.owners)
    test_images = torch.cat([torch.stack([s[0] for s in e.dataset]) for e in benchmark.test_stream])
    assert torch.equal(s_prompts.model.eval().route(test_images), color.model.eval().route(test_images))


# ---------------------------------------------------------------------- S-Prompts: training


class GradientRecorder(SupervisedPlugin):
    def __init__(self):
        super().__init__()
        self.with_gradient = []

    def after_backward(self, strategy, **kwargs):
        self.with_gradient.append(
            {name for name, p in strategy.model.named_parameters() if p.grad is not None and p.grad.any()}
        )


def test_only_the_current_prompts_and_head_learn():
    recorder = GradientRecorder()
    strategy = tiny_s_prompts(train_epochs=2, plugins=[recorder])
    benchmark = domain_stream()
    strategy.train(benchmark.train_stream[0])
    before = {k: v.clone() for k, v in strategy.model.experts_state_dict().items()}
    recorder.with_gradient.clear()
    strategy.train(benchmark.train_stream[1])
    assert recorder.with_gradient
    for names in recorder.with_gradient:
        assert names == {"prompts.1.tokens", "bank.heads.1.linear.weight", "bank.heads.1.linear.bias"}, names
    after = strategy.model.experts_state_dict()
    for key, value in before.items():
        if key.startswith(("prompts.0.", "heads.0.")):
            assert torch.equal(value, after[key]), key
    optimised = {id(p) for group in strategy.optimizer.param_groups for p in group["params"]}
    assert optimised == {id(p) for p in strategy.model.expert_parameters(1)}


def test_expert_parameters_are_its_prompt_tokens_and_head():
    model = PromptExpertViT(tiny_vit())  # S-Prompts' default: 10 tokens
    model.start_expert([0, 1])
    assert model.prompt_length == 10
    assert sum(p.numel() for p in model.expert_parameters(0)) == 10 * 32 + (32 * 2 + 2)


def test_s_prompts_routes_domains_far_apart_and_beats_chance():
    results = train_all(tiny_s_prompts(k=5), domain_stream(num_domains=3))
    assert stream_metric(results, "RoutingAcc") == 1.0
    assert stream_metric(results, "Top1_Acc") > 1 / 3 + 0.3  # chance: 1/3


def test_s_prompts_beats_chance_on_a_class_incremental_stream():
    results = train_all(tiny_s_prompts(), class_stream())
    assert stream_metric(results, "Top1_Acc") > 0.8  # chance: 1/4


def test_s_prompts_state_round_trips_without_the_backbone():
    strategy = tiny_s_prompts(train_epochs=1)
    benchmark = class_stream()
    for experience in benchmark.train_stream:
        strategy.train(experience)
    trained = strategy.model.eval()
    state = trained.experts_state_dict()
    assert not any(k.startswith("backbone.") for k in state)
    restored = PromptExpertViT(tiny_vit(), prompt_length=4)
    restored.load_experts_state_dict(state)
    x = torch.cat([torch.stack([s[0] for s in e.dataset]) for e in benchmark.test_stream])
    assert torch.equal(restored.eval()(x), trained(x))
    with pytest.raises(ValueError, match=r"prompts.0.tokens has shape \(4, 32\), this model's experts have "
                                         r"\(10, 32\) \(prompt_length=10\)"):
        PromptExpertViT(tiny_vit()).load_experts_state_dict(state)


# ---------------------------------------------------------------------- S-Prompts: bad input


@pytest.mark.parametrize("prompt_length", [-1, 0, 2.5, True])
def test_refuses_bad_prompt_length(prompt_length):
    with pytest.raises(ValueError, match=rf"prompt_length must be an integer >= 1, got {prompt_length!r}"):
        SPrompts(tiny_vit(), prompt_length=prompt_length)


@pytest.mark.parametrize("option, value, message", [
    ("k", 0, "k must be an integer >= 1, got 0"),
    ("routing_features", "nearest", "routing_features must be one of .*got 'nearest'"),
    ("distance", "l2", "distance must be one of .*got 'l2'"),
    ("lr", 0, "lr must be a number > 0, got 0"),
])
def test_s_prompts_refuses_bad_options(option, value, message):
    with pytest.raises(ValueError, match=message):
        SPrompts(tiny_vit(), **{option: value})


def test_s_prompts_refuses_a_model_that_is_not_a_vit_and_conflicting_settings():
    with pytest.raises(TypeError, match="model must be a timm.*VisionTransformer.*got torch.nn.*Linear"):
        SPrompts(torch.nn.Linear(4, 4))
    with pytest.raises(ValueError, match=r"already a configured PromptExpertViT .* leave \['prompt_length'\] unset"):
        SPrompts(PromptExpertViT(tiny_vit()), prompt_length=3)


def test_s_prompts_evaluation_before_training_is_an_untrained_models():
    results = tiny_s_prompts().eval(class_stream().test_stream)
    assert stream_metric(results, "Top1_Acc") == pytest.approx(0.25)  # all 4 classes tie: class 0 wins
