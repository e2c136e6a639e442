"""L2P: prompts chosen by key-query match, the surrogate loss, class masking, any ViT size, training."""

import pytest
import torch

from avalanche_color import L2P, L2PViT, PromptPool
from avalanche_color.peers.prompts import prompt_outputs, prompted_tokens
from helpers import quiet_evaluator, stream_metric, train_all
from streams import class_stream, tiny_vit


def images(count=6, seed=0, size=16):
    return torch.randn(count, 3, size, size, generator=torch.Generator().manual_seed(seed))


def tiny_l2p(seed=0, **options):
    settings = dict(pool_size=10, prompt_length=2, top_n=3, lr=0.01, train_epochs=8, train_mb_size=16,
                    eval_mb_size=64)
    settings.update(options)
    return L2P(tiny_vit(seed), evaluator=quiet_evaluator(), **settings)


def model_with_classes(*experiences, **options):
    model = L2PViT(tiny_vit(), **{**dict(pool_size=6, prompt_length=2, top_n=2), **options})
    for classes in experiences:
        model.learn_classes(classes)
    return model


# ---------------------------------------------------------------------- selection by key-query match


@torch.no_grad()
def test_each_sample_picks_the_prompt_whose_key_is_its_query():
    model = model_with_classes([0, 1]).eval()
    x = images(6)
    queries = model.query(x)
    # Key j is sample order[j]'s own query: cosine 1, the best any key can match.
    order = torch.tensor([3, 0, 5, 1, 4, 2])
    model.pool.keys.copy_(queries[order])
    _, selection = model.select_prompts(x)
    assert torch.equal(selection[:, 0], order.argsort())


@torch.no_grad()
def test_selection_is_the_top_n_cosine_matches_best_first():
    pool = PromptPool(pool_size=8, prompt_length=2, width=16)
    queries = torch.randn(20, 16, generator=torch.Generator().manual_seed(3))
    cosine = torch.nn.functional.cosine_similarity(queries[:, None], pool.keys[None], dim=-1)
    expected = cosine.argsort(dim=1, descending=True)[:, :3]
    assert torch.equal(pool.select(queries, 3), expected)


@torch.no_grad()
def test_the_output_uses_exactly_the_selected_prompts():
    model = model_with_classes([0, 1, 2]).eval()
    x = images(6)
    logits = model(x)
    _, selection = model.select_prompts(x)
    assert torch.equal(model(x, selection), logits)
    prompts = model.pool.prompts[selection].flatten(1, 2)  # (batch, top_n * length, width)
    tokens = prompted_tokens(model.backbone, x, prompts)
    by_hand = model.head(prompt_outputs(tokens, prompts.shape[1], model.backbone.num_prefix_tokens).mean(1))
    torch.testing.assert_close(logits, by_hand)

    unused = sorted(set(range(6)) - set(selection.unique().tolist()))
    assert unused, "every prompt was selected: the test needs an unused one"
    noise = torch.randn(model.pool.prompts.shape, generator=torch.Generator().manual_seed(5))
    model.pool.prompts[unused] += noise[unused]  # prompts nobody selected change nothing
    torch.testing.assert_close(model(x), logits)
    model.pool.prompts[selection[0, 0]] += noise[selection[0, 0]]  # a selected one does
    assert not torch.allclose(model(x)[0], logits[0])


@pytest.mark.parametrize("prompt_init, prompts_range, keys_range", [
    ("uniform", (-1.0, 1.0), (-1.0, 1.0)),  # Avalanche's port
    ("zero", (0.0, 0.0), (-1.0, 1.0)),
    ("code", (0.0, 0.01), (0.0, 0.01)),  # L2P's code: flax uniform(), prompts and keys alike
])
def test_prompt_init_draws_prompts_and_keys_from_its_range(prompt_init, prompts_range, keys_range):
    torch.manual_seed(0)
    pool = PromptPool(pool_size=64, prompt_length=4, width=32, prompt_init=prompt_init)
    for values, (low, high) in ((pool.prompts.detach(), prompts_range), (pool.keys.detach(), keys_range)):
        assert low <= float(values.min()) and float(values.max()) <= high
        assert float(values.max()) - float(values.min()) >= 0.9 * (high - low)  # the whole range, not a corner


@pytest.mark.parametrize("head_init, untrained", [("linear", float("-inf")), ("zero", 0.0)])
def test_head_init_zero_starts_rows_at_zero_and_scores_untrained_classes_zero_as_the_codes_fixed_head(
        head_init, untrained):
    strategy = L2P(tiny_vit(0), pool_size=4, prompt_length=2, top_n=2, head_init=head_init, train_epochs=1,
                   train_mb_size=16, evaluator=quiet_evaluator())
    benchmark = class_stream(num_experiences=2, per_class=8)
    later, first = benchmark.train_stream[1], benchmark.train_stream[0]
    strategy.model.adaptation(first)
    assert bool((strategy.model.head.weight == 0).all()) == (head_init == "zero")
    strategy.train(first)
    strategy.eval(benchmark.test_stream)  # the later experience's classes are seen, never trained
    model = strategy.model.eval()
    with torch.no_grad():
        logits = model(torch.stack([s[0] for s in benchmark.test_stream[0].dataset]))
    trained, never = sorted(first.classes_in_this_experience), sorted(later.classes_in_this_experience)
    assert logits.shape[1] == 4 and sorted(trained + never) == [0, 1, 2, 3]
    assert bool((logits[:, never] == untrained).all())  # never trained: the code's zero rows, or the port's -inf
    assert bool(logits[:, trained].isfinite().all()) and bool((logits[:, trained] != 0).any())


def test_surrogate_loss_pulls_only_the_selected_keys_towards_their_queries():
    pool = PromptPool(pool_size=8, prompt_length=2, width=16)
    queries = torch.randn(5, 16, generator=torch.Generator().manual_seed(4))
    selection = pool.select(queries, 2)
    loss = pool.surrogate_loss(queries, selection)
    loss.backward()
    selected = set(selection.unique().tolist())
    for key in range(8):
        assert bool(pool.keys.grad[key].any()) == (key in selected), key
    assert pool.prompts.grad is None  # the prompts learn from the classification loss only
    with torch.no_grad():
        pool.keys -= 0.5 * pool.keys.grad
        assert pool.surrogate_loss(queries, selection) < loss  # the chosen keys moved towards the queries


# ---------------------------------------------------------------------- classes and masking


@torch.no_grad()
def test_class_masking_in_training_and_untrained_classes_at_evaluation():
    model = model_with_classes([0, 1], [2, 3])
    x = images(4)
    training = model.train()(x)
    assert torch.isinf(training[:, :2]).all() and torch.isfinite(training[:, 2:]).all()
    model.max_class_label = 6  # an evaluation experience with classes 4, 5 that were never trained
    evaluation = model.eval()(x)
    assert evaluation.shape == (4, 6)
    assert torch.isfinite(evaluation[:, :4]).all() and torch.isinf(evaluation[:, 4:]).all()
    unmasked = model_with_classes([0, 1], [2, 3], class_masking=False).train()(x)
    assert torch.isfinite(unmasked).all()


def test_head_grows_and_keeps_what_earlier_classes_learned():
    model = model_with_classes([0, 1])
    with torch.no_grad():
        model.head.weight.fill_(0.5)
    old = model.head.weight.clone()
    model.learn_classes([4, 5])
    assert model.head.out_features == 6 and torch.equal(model.head.weight[:2], old)
    assert model.trained_classes.tolist() == [True, True, False, False, True, True]


# ---------------------------------------------------------------------- any ViT


@pytest.mark.parametrize("variant", [
    dict(embed_dim=48, depth=3, num_heads=3, img_size=24, patch_size=6),
    dict(reg_tokens=2, global_pool="avg"),
    dict(class_token=False, global_pool="avg"),
], ids=["48-wide-24px", "registers-avg-pool", "no-cls-token"])
@torch.no_grad()
def test_l2p_takes_width_depth_and_image_size_from_the_model(variant):
    vit = tiny_vit(**variant)
    model = L2PViT(vit)  # the L2P paper's pool: 10 prompts of 5 tokens, 5 chosen
    model.learn_classes([0, 1, 2])
    width, size = vit.embed_dim, vit.patch_embed.img_size[0]
    assert model.pool.prompts.shape == (10, 5, width) and model.pool.keys.shape == (10, vit.num_features)
    assert model.eval()(images(2, size=size)).shape == (2, 3)
    assert model.select_prompts(images(2, size=size))[1].shape == (2, 5)


def test_trainable_parameters_are_pool_and_head():
    model = model_with_classes([0, 1], pool_size=10, prompt_length=5, top_n=5)
    assert sum(p.numel() for p in model.trainable_parameters()) == 10 * 32 + 10 * 5 * 32 + (32 * 2 + 2)


# ---------------------------------------------------------------------- training


def test_l2p_trains_the_pool_and_head_and_leaves_the_backbone():
    strategy = tiny_l2p(train_epochs=1)
    backbone = {k: v.clone() for k, v in strategy.model.backbone.state_dict().items()}
    keys, prompts = strategy.model.pool.keys.clone(), strategy.model.pool.prompts.clone()
    strategy.train(class_stream().train_stream[0])
    assert all(torch.equal(v, strategy.model.backbone.state_dict()[k]) for k, v in backbone.items())
    assert not torch.equal(keys, strategy.model.pool.keys)  # the surrogate loss moved the keys
    assert not torch.equal(prompts, strategy.model.pool.prompts)
    optimised = {id(p) for group in strategy.optimizer.param_groups for p in group["params"]}
    assert optimised == {id(p) for p in strategy.model.trainable_parameters()}


def test_l2p_learns_an_experience_with_its_default_head():
    benchmark = class_stream()
    strategy = tiny_l2p(lr=0.003)
    strategy.train(benchmark.train_stream[0])
    accuracy = stream_metric(strategy.eval(benchmark.test_stream[:1]), "Top1_Acc")
    assert accuracy > 0.7  # chance: 1/2 of the experience's classes


def test_l2p_beats_chance_on_a_class_incremental_stream():
    # A random tiny ViT's prompt-position outputs carry little of the image, so this
    # seconds-long run reads the pooled [CLS] feature (L2P's other head option).
    results = train_all(tiny_l2p(head_input="pooled"), class_stream())
    assert stream_metric(results, "Top1_Acc") > 0.25 + 0.15  # chance: 1/4


def test_l2p_state_round_trips():
    strategy = tiny_l2p(train_epochs=1)
    benchmark = class_stream()
    for experience in benchmark.train_stream:
        strategy.train(experience)
    trained = strategy.model.eval()
    restored = L2PViT(tiny_vit(), pool_size=10, prompt_length=2, top_n=3)
    restored.load_state_dict(trained.state_dict())
    x = torch.cat([torch.stack([s[0] for s in e.dataset]) for e in benchmark.test_stream])
    assert torch.equal(restored.eval()(x), trained(x))


# ---------------------------------------------------------------------- bad input


@pytest.mark.parametrize("option, value, message", [
    ("pool_size", 0, "pool_size must be an integer >= 1, got 0"),
    ("prompt_length", 0, "prompt_length must be an integer >= 1, got 0"),
    ("top_n", 2.5, "top_n must be an integer >= 1, got 2.5"),
    ("top_n", 11, "top_n must be at most pool_size=10, got top_n=11"),
    ("head_input", "cls", "head_input must be one of .*got 'cls'"),
    ("prompt_init", "normal", "prompt_init must be one of .*got 'normal'"),
    ("surrogate_weight", -1, "surrogate_weight must be a number >= 0, got -1"),
    ("lr", 0, "lr must be a number > 0, got 0"),
    ("train_epochs", 0, "train_epochs must be an integer >= 1, got 0"),
])
def test_l2p_refuses_bad_options(option, value, message):
    with pytest.raises(ValueError, match=message):
        L2P(tiny_vit(), **{option: value})


def test_l2p_refuses_a_model_that_is_not_a_vit_and_conflicting_settings():
    with pytest.raises(TypeError, match="model must be a timm.*VisionTransformer.*got torch.nn.*Sequential"):
        L2P(torch.nn.Sequential())
    with pytest.raises(ValueError, match=r"already a configured L2PViT .* leave \['top_n'\] unset"):
        L2P(L2PViT(tiny_vit()), top_n=3)


def test_l2p_evaluation_before_training_is_an_untrained_models():
    results = tiny_l2p().eval(class_stream().test_stream)
    assert stream_metric(results, "Top1_Acc") == pytest.approx(0.25)  # all 4 classes tie: class 0 wins
    model = L2PViT(tiny_vit()).eval()
    model.max_class_label = 3
    assert torch.equal(model(images(2)), torch.zeros(2, 3))
