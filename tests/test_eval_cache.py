"""The evaluation cache is exact, and reuses what does not change."""

import pytest
import torch

from helpers import tiny_color, train_all
from streams import class_stream


def test_image_keys_follow_content():
    from avalanche_color.routing.eval_cache import image_keys

    x = torch.randn(3, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    keys = image_keys(x)
    assert len(set(keys)) == 3
    assert image_keys(x.clone()) == keys
    changed = x.clone()
    changed[1, 0, 0, 0] += 1e-3
    assert image_keys(changed) == [keys[0], image_keys(changed[1:2])[0], keys[2]]
    assert image_keys(changed)[1] != keys[1]


@pytest.mark.parametrize("routing", ["backbone", "first_expert"])
def test_cached_evaluation_equals_uncached_after_every_experience(routing):
    benchmark = class_stream(num_experiences=3)
    cached = tiny_color(routing=routing, train_epochs=2, cache_evaluation=True)
    plain = tiny_color(routing=routing, train_epochs=2)
    for index, experience in enumerate(benchmark.train_stream):
        for strategy in (cached, plain):
            torch.manual_seed(index)  # the same shuffling for both
            strategy.train(experience)
        assert cached.eval(benchmark.test_stream) == pytest.approx(plain.eval(benchmark.test_stream), abs=1e-9)
    images = torch.cat([torch.stack([s[0] for s in e.dataset]) for e in benchmark.test_stream])
    cached.model.eval()
    plain.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(cached.model(images), plain.model(images), rtol=1e-5, atol=1e-5)


def test_cache_reuses_routing_features_and_frozen_experts():
    benchmark = class_stream(num_experiences=3)
    strategy = tiny_color(train_epochs=1, cache_evaluation=True)
    cache = strategy.model.eval_cache
    for experience in benchmark.train_stream:
        strategy.train(experience)
        strategy.eval(benchmark.test_stream)
    images = torch.cat([torch.stack([s[0] for s in e.dataset]) for e in benchmark.test_stream])
    with torch.no_grad():
        routed = strategy.model.eval().route(images)
    to_frozen = int((routed < 2).sum())  # experts 0 and 1 are frozen; expert 2 may still train
    assert 0 < to_frozen < len(images)
    hits_before = cache.hits
    strategy.eval(benchmark.test_stream)  # nothing changed since the last evaluation
    assert cache.hits - hits_before == len(images) + to_frozen  # all routing features, frozen rows
    assert len(cache.features) == len(images)


def test_cache_never_stores_the_training_expert():
    strategy = tiny_color(train_epochs=1, cache_evaluation=True)
    strategy.train(class_stream().train_stream[0])
    model = strategy.model
    model.requires_grad_(False)
    for p in model.expert_parameters(0):  # as during an eval inside training
        p.requires_grad_(True)
    model.eval()
    with torch.no_grad():
        model(torch.randn(4, 3, 16, 16))
    assert not model.eval_cache.logits
