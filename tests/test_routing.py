"""Prototypes and routing: k-means on the right features, per-sample choice, oracle, metric."""

import pytest
import torch

from avalanche_color import PrototypeRouter, fit_class_prototypes, fit_prototypes
from helpers import stream_metric, tiny_color, train_all
from streams import class_stream, domain_stream


def stream_images(stream):
    return [torch.stack([sample[0] for sample in experience.dataset]) for experience in stream]


def test_routing_is_perfect_on_domains_far_apart():
    benchmark = domain_stream(num_domains=3)
    strategy = tiny_color(k=5)
    results = train_all(strategy, benchmark)
    assert stream_metric(results, "RoutingAcc") == 1.0
    model = strategy.model.eval()
    for expert, images in enumerate(stream_images(benchmark.test_stream)):
        assert model.route(images).tolist() == [expert] * len(images)


def test_prototypes_are_kmeans_of_normalised_backbone_features():
    benchmark = class_stream()
    strategy = tiny_color(k=3, prototype_data="eval")
    train_all(strategy, benchmark)
    model = strategy.model
    for expert, images in enumerate(stream_images(benchmark.train_stream)):
        features = torch.nn.functional.normalize(model.features(images), dim=-1)
        expected = fit_prototypes(features, 3, seed=0, n_init=10)
        torch.testing.assert_close(model.router.prototypes[model.router.owners == expert], expected)


def test_color_plus_plus_routes_with_first_expert_features():
    benchmark = class_stream(num_experiences=3)
    strategy = tiny_color(k=2, routing_features="first_expert", prototype_data="eval")
    train_all(strategy, benchmark)
    model = strategy.model
    images = stream_images(benchmark.train_stream)
    for expert, experience_images in enumerate(images):
        with_first = torch.nn.functional.normalize(model.features(experience_images, 0), dim=-1)
        expected = fit_prototypes(with_first, 2, seed=0, n_init=10)
        torch.testing.assert_close(model.router.prototypes[model.router.owners == expert], expected)
    test_images = torch.cat(stream_images(benchmark.test_stream))
    features = torch.nn.functional.normalize(model.features(test_images, 0), dim=-1)
    assert torch.equal(model.route(test_images), model.router(features))
    backbone_only = torch.nn.functional.normalize(model.features(test_images), dim=-1)
    assert not torch.allclose(features, backbone_only)


def test_oracle_routing_follows_task_labels():
    benchmark = class_stream(num_experiences=3, task_labels=True)
    strategy = tiny_color(router="oracle")
    results = train_all(strategy, benchmark)
    model = strategy.model.eval()
    images = torch.cat(stream_images(benchmark.test_stream))
    task_labels = torch.tensor([2, 0, 1, 2] * (len(images) // 4))
    assert torch.equal(model.route(images[: len(task_labels)], task_labels), task_labels)
    assert stream_metric(results, "RoutingAcc") == 1.0
    assert stream_metric(results, "Top1_Acc") > 0.9


def test_oracle_routing_refuses_a_stream_without_distinct_task_labels_before_training_on_it():
    strategy = tiny_color(router="oracle", train_epochs=1)
    benchmark = class_stream()
    strategy.train(benchmark.train_stream[0])
    with pytest.raises(ValueError, match="every experience needs its own: experience 1 has task label 0, like experience 0"):
        strategy.train(benchmark.train_stream[1])
    assert strategy.model.num_experts == 1


def test_router_picks_each_samples_nearest_prototype_per_sample():
    router = PrototypeRouter()
    router.set_prototypes(0, torch.tensor([[0.0, 0.0], [10.0, 0.0]]))
    router.set_prototypes(1, torch.tensor([[0.0, 10.0]]))
    features = torch.tensor([[1.0, 1.0], [9.0, 1.0], [1.0, 9.0], [0.0, 6.0]])
    assert router(features).tolist() == [0, 0, 1, 1]
    router.set_prototypes(1, torch.tensor([[100.0, 100.0]]))  # replaces expert 1's prototypes
    assert router(features).tolist() == [0, 0, 0, 0]
    assert len(router.prototypes) == 3


@pytest.mark.parametrize("distance", ["euclidean", "l1", "cosine"])
def test_distance_options_agree_with_their_definitions(distance):
    router = PrototypeRouter(distance)
    prototypes = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    router.set_prototypes(0, prototypes[:3])
    router.set_prototypes(1, prototypes[3:])
    features = torch.randn(20, 4, generator=torch.Generator().manual_seed(1))
    if distance == "euclidean":
        d = ((features[:, None] - prototypes[None]) ** 2).sum(-1)
    elif distance == "l1":
        d = (features[:, None] - prototypes[None]).abs().sum(-1)
    else:
        d = -torch.nn.functional.cosine_similarity(features[:, None], prototypes[None], dim=-1)
    assert torch.equal(router(features), d.argmin(1) // 3)


def test_kmeans_is_seeded():
    features = torch.randn(50, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(fit_prototypes(features, 4, seed=3), fit_prototypes(features, 4, seed=3))


def test_class_prototypes_fit_each_class_on_its_own_samples():
    generator = torch.Generator().manual_seed(0)
    offsets = torch.tensor([[10.0, 0.0], [0.0, 10.0], [-10.0, 0.0]])
    labels = torch.tensor([0, 1, 2]).repeat_interleave(6)
    labels[-1] = 1  # class 2 keeps 5 samples; ask for more centres than some classes have
    features = offsets[labels] + 0.1 * torch.randn(len(labels), 2, generator=generator)
    centres = fit_class_prototypes(features, labels, 3)
    assert centres.shape == (9, 2)
    for index, centre in enumerate(centres):  # class by class, each centre near its own class
        assert torch.cdist(centre[None], offsets).argmin() == index // 3
    few = fit_class_prototypes(features[:2], labels[:2], 4)  # one class, two samples
    assert few.shape == (2, 2)


def test_per_class_prototypes_give_every_class_its_own_and_learn():
    strategy = tiny_color(prototypes_per_class=2)
    benchmark = class_stream()
    results = train_all(strategy, benchmark)
    owners = strategy.model.router.owners.tolist()
    assert owners == [0, 0, 0, 0, 1, 1, 1, 1]  # 2 classes x 2 centres per expert, k unused
    assert stream_metric(results, "Top1_Acc") > 0.6  # chance: 0.25


def test_revisiting_an_experience_adds_a_further_expert_and_leaves_the_others_unchanged():
    strategy = tiny_color(train_epochs=2)
    benchmark = class_stream()
    first, second = benchmark.train_stream
    strategy.train(first)
    strategy.train(second)
    before = {k: v.clone() for k, v in strategy.model.experts_state_dict().items()}
    strategy.train(first)
    model = strategy.model
    assert model.num_experts == 3 and model.bank.experiences.tolist() == [0, 1, 0]
    assert model.bank.heads[2].classes.tolist() == [0, 1] and model.bank.finished.tolist() == [True, True, True]
    after = model.experts_state_dict()
    for key, value in before.items():
        if key.startswith(("heads.0.", "heads.1.")) or ".experts.0." in key or ".experts.1." in key:
            assert torch.equal(after[key], value), key
    assert sorted(set(model.router.owners.tolist())) == [0, 1, 2]
    results = strategy.eval(benchmark.test_stream)
    assert stream_metric(results, "RoutingAcc") > 0.6  # a sample of exp0 may go to either of its experts
