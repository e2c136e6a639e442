"""The evaluation cache is exact, and reuses what does not change."""

import pytest
import torch

from helpers import tiny_color
from streams import class_stream


def test_image_keys_follow_content():
    from avalanche_color.experts.routed_vit import image_keys

    x = torch.randn(3, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    keys = image_keys(x)
    assert len(set(keys)) == 3
    assert image_keys(x.clone()) == keys
    changed = x.clone()
    changed[1, 0, 0, 0] += 1e-3
    assert image_keys(changed) == [keys[0], image_keys(changed[1:2])[0], keys[2]]
    assert image_keys(changed)[1] != keys[1]


@pytest.mark.parametrize("keys", ["bytes", "device digests"])
@pytest.mark.parametrize("routing", ["backbone", "first_expert"])
def test_cached_evaluation_equals_uncached_after_every_experience(routing, keys, monkeypatch):
    if keys == "device digests":  # the keys an accelerator uses, here on the CPU
        from avalanche_color.experts import routed_vit
        from avalanche_color.experts.routed_vit import device_digests
        monkeypatch.setattr(routed_vit, "image_keys", lambda x: [r.tobytes() for r in device_digests(x).numpy()])
    benchmark = class_stream(num_experiences=3)
    cached = tiny_color(routing_features=routing, train_epochs=2, cache_evaluation=True)
    plain = tiny_color(routing_features=routing, train_epochs=2)
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
    assert len(set(routed.tolist())) == 3  # every expert, each finished after its experience, is reused
    hits_before = cache.hits
    strategy.eval(benchmark.test_stream)  # nothing changed since the last evaluation
    assert cache.hits - hits_before == 2 * len(images)  # all routing features, all rows
    assert len(cache.features) == len(images)


def test_cache_never_stores_the_training_expert():
    strategy = tiny_color(train_epochs=1, cache_evaluation=True)
    strategy.train(class_stream().train_stream[0])
    model = strategy.model
    model.bank.finished[0] = False  # as during an eval inside training: the expert still trains
    model.bank.set_trainable(0)
    model.eval()
    with torch.no_grad():
        model(torch.randn(4, 3, 16, 16))
    assert not model.eval_cache.logits and model.eval_cache.features  # routing features are the backbone's


def test_requires_grad_changes_neither_the_computation_nor_what_the_cache_keeps():
    benchmark = class_stream(num_experiences=2)
    strategy = tiny_color(train_epochs=1, cache_evaluation=True)
    for experience in benchmark.train_stream:
        strategy.train(experience)
    model = strategy.model.eval()
    images = torch.cat([torch.stack([s[0] for s in e.dataset]) for e in benchmark.test_stream])
    with torch.no_grad():
        expected = model(images)
    stored = (set(model.eval_cache.features), set(model.eval_cache.logits))
    model.requires_grad_(True)  # a user's call: it makes no expert the one that trains
    assert model.bank.trainable is None
    model.eval_cache.clear()
    with torch.no_grad():
        assert torch.equal(model(images), expected)  # the same kernels as before
    assert (set(model.eval_cache.features), set(model.eval_cache.logits)) == stored
    with torch.no_grad():  # train mode, given experts: frozen experts computed as in eval mode
        assert torch.equal(model.train()(images, experts=model.route(images)), expected)


def test_loading_a_state_drops_the_cached_work():
    benchmark = class_stream(num_experiences=2)
    strategy = tiny_color(train_epochs=1, cache_evaluation=True)
    other = tiny_color(train_epochs=1, lr=0.2, seed=1)
    for experience in benchmark.train_stream:
        strategy.train(experience)
        other.train(experience)
    strategy.eval(benchmark.test_stream)
    model = strategy.model
    assert model.eval_cache.logits and model.eval_cache.features
    model.load_state_dict(other.model.state_dict())
    assert not model.eval_cache.logits and not model.eval_cache.features
    images = torch.cat([torch.stack([s[0] for s in e.dataset]) for e in benchmark.test_stream])
    with torch.no_grad():
        assert torch.equal(model.eval()(images), other.model.eval()(images))


def test_device_digests_tell_images_apart_and_depend_only_on_each_image():
    from avalanche_color.experts.routed_vit import device_digests

    generator = torch.Generator().manual_seed(0)
    images = torch.randn(6, 3, 16, 16, generator=generator)
    digests = device_digests(images)
    assert torch.equal(device_digests(images.clone()), digests)
    assert torch.equal(device_digests(images[[3, 1]]), digests[[3, 1]])  # row by row, batch-independent
    assert len({tuple(row) for row in digests.tolist()}) == 6
    for trial in range(200):  # one changed value: a sign flip, the next float, or a swap of two pixels
        changed = images.clone()
        c, i, j = (int(v) for v in torch.randint(0, 16, (3,), generator=generator))
        c %= 3
        if trial % 3 == 0:
            changed[2, c, i, j] = -changed[2, c, i, j]
        elif trial % 3 == 1:
            changed[2, c, i, j] = torch.nextafter(changed[2, c, i, j], torch.tensor(float("inf")))
        else:
            changed[2, c, i, j], changed[2, c, j, i] = images[2, c, j, i], images[2, c, i, j]
            if torch.equal(changed, images):
                continue
        new = device_digests(changed)
        assert not torch.equal(new[2], digests[2]) and torch.equal(new[[0, 1, 3, 4, 5]], digests[[0, 1, 3, 4, 5]])
    assert device_digests(torch.zeros(2, 3, 5, 5, dtype=torch.uint8)).shape == (2, 2)  # odd byte counts


def test_the_cache_stays_within_its_memory_bound_and_exact():
    benchmark = class_stream(num_experiences=2)
    bounded, plain = tiny_color(train_epochs=1, cache_evaluation=True), tiny_color(train_epochs=1)
    for experience in benchmark.train_stream:
        for strategy in (bounded, plain):
            torch.manual_seed(0)
            strategy.train(experience)
    cache = bounded.model.eval_cache
    cache.max_bytes = 2 * 10 * 32 * 4  # ten routing features (32 float32 numbers each), ten logit rows
    for _ in range(2):
        assert bounded.eval(benchmark.test_stream) == pytest.approx(plain.eval(benchmark.test_stream), abs=1e-9)
        assert len(cache.features) == 10 and 0 < len(cache.logits) <= 80  # 80 test images, 16 bytes a row
        for memo in (cache.features, cache.logits):
            assert sum(v.numel() * v.element_size() for v in memo.values()) <= cache.max_bytes // 2
