"""Class-level routers: closed forms, order independence, pending refits, state, end-to-end routing."""

from __future__ import annotations

import pytest
import torch

from avalanche_color import CoLoRConfig, SPrompts, read_checkpoint, train_stream
from avalanche_color.routing.routers import ClassRouter
from avalanche_color.routing.classifiers import (RELATIVE_RIDGE_GRID, SHRINKAGE, GaussianClassifier, RandomFeatureRidge,
                                                 solve_ridge)
from avalanche_color.training.resume import ResumePlugin
from helpers import quiet_evaluator, stream_metric, tiny_color, train_all
from streams import class_stream, domain_stream, tiny_vit

ROUTERS = ("ridge", "gaussian")


def experiences(seed: int = 0, count: int = 3, per: int = 40, dim: int = 6, classes: int = 4):
    """``count`` chunks of (features, targets) from Gaussian blobs, targets in [0, classes * count)."""
    generator = torch.Generator().manual_seed(seed)
    centres = 3 * torch.randn(classes * count, dim, generator=generator, dtype=torch.float64)
    chunks = []
    for index in range(count):
        targets = torch.arange(classes).repeat(per // classes) + index * classes
        chunks.append((centres[targets] + torch.randn(len(targets), dim, generator=generator, dtype=torch.float64),
                       targets))
    return chunks


def test_ridge_fitted_experience_by_experience_equals_one_direct_solve_on_all_data():
    chunks = experiences()
    ridge = RandomFeatureRidge(6, 64, seed=3, ridge=0.5)
    for features, targets in chunks:
        ridge.fit(features, targets)
    features = torch.cat([f for f, _ in chunks])
    targets = torch.cat([t for _, t in chunks])
    expanded = ridge.expand(features).double()
    one_hot = torch.nn.functional.one_hot(targets).double()
    direct = torch.linalg.solve(expanded.T @ expanded + 0.5 * torch.eye(64, dtype=torch.float64), expanded.T @ one_hot)
    torch.testing.assert_close(ridge.readout, direct.float(), rtol=1e-5, atol=1e-6)


def test_ridge_lambda_is_chosen_from_the_relative_grid_on_held_out_samples():
    features, targets = experiences(count=1, per=80)[0]
    ridge = RandomFeatureRidge(6, 64, seed=0)
    ridge.fit(features, targets)
    scale = float(torch.diagonal(ridge.gram).mean())
    assert any(abs(float(ridge.ridge) - relative * scale) < 1e-9 * scale for relative in RELATIVE_RIDGE_GRID)
    # The chosen λ separates these blobs: the readout classifies its own training data well.
    assert float((ridge(features).argmax(1) == targets).double().mean()) > 0.9


def test_gaussian_fitted_experience_by_experience_equals_lda_on_all_data():
    chunks = experiences()
    gaussian = GaussianClassifier(6)
    for features, targets in chunks:
        gaussian.fit(features, targets)
    features = torch.cat([f for f, _ in chunks])
    targets = torch.cat([t for _, t in chunks])
    means = torch.stack([features[targets == c].mean(0) for c in range(12)])
    centred = features - means[targets]
    covariance = centred.T @ centred / (len(features) - 12)
    covariance += SHRINKAGE * torch.trace(covariance) / 6 * torch.eye(6, dtype=torch.float64)
    precision = torch.linalg.inv(covariance)
    expected = features @ precision @ means.T - 0.5 * ((means @ precision) * means).sum(1)
    torch.testing.assert_close(gaussian(features), expected.float(), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("kind", ROUTERS)
def test_accumulating_in_another_order_gives_the_same_classifier(kind):
    chunks = experiences()

    def fitted(order):
        classifier = RandomFeatureRidge(6, 64, seed=0, ridge=1.0) if kind == "ridge" else GaussianClassifier(6)
        for index in order:
            classifier.fit(*chunks[index])
        return classifier

    probe = torch.cat([f for f, _ in chunks])
    torch.testing.assert_close(fitted([0, 1, 2])(probe), fitted([2, 0, 1])(probe), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ROUTERS)
def test_refitting_a_pending_expert_replaces_its_samples_and_finish_keeps_them(kind):
    chunks = experiences()
    once, twice = ClassRouter(kind, 6, 64), ClassRouter(kind, 6, 64)
    for expert, (features, targets) in enumerate(chunks):
        once.fit(expert, features, targets)
        twice.fit(expert, features + 1.0, targets)  # an earlier fit (CoLoR++'s features still changing) ...
        twice.fit(expert, features, targets)  # ... replaced by the final one
        once.finish(expert)
        twice.finish(expert)
    assert not once.pending_features.numel()
    probe = torch.cat([f for f, _ in chunks])
    torch.testing.assert_close(once.pair_scores(probe), twice.pair_scores(probe), rtol=1e-4, atol=1e-4)
    assert torch.equal(once.pair_experts, torch.arange(3).repeat_interleave(4))
    assert torch.equal(once(probe), once.pair_experts[once.pair_scores(probe).argmax(1)])


def test_pairs_of_a_domain_incremental_stream_name_the_expert_not_only_the_class():
    router = ClassRouter("gaussian", 6, 64)
    chunks = experiences(count=2, classes=3)
    for expert, (features, targets) in enumerate(chunks):
        router.fit(expert, features, targets % 3)  # every experience has classes 0, 1, 2
        router.finish(expert)
    assert router.pair_classes.tolist() == [0, 1, 2, 0, 1, 2]
    assert router.pair_experts.tolist() == [0, 0, 0, 1, 1, 1]
    for expert, (features, _) in enumerate(chunks):
        assert (router(features) == expert).double().mean() > 0.95


@pytest.mark.parametrize("kind", ROUTERS)
@pytest.mark.parametrize("make_stream", [lambda: class_stream(num_experiences=3), lambda: domain_stream(num_domains=3)])
def test_separable_streams_are_routed_perfectly(kind, make_stream):
    benchmark = make_stream()
    strategy = tiny_color(router=kind, router_width=256)
    results = train_all(strategy, benchmark)
    assert stream_metric(results, "RoutingAcc") == 1.0
    model = strategy.model.eval()
    assert isinstance(model.router, ClassRouter) and model.router.kind == kind
    for expert, experience in enumerate(benchmark.test_stream):
        images = torch.stack([sample[0] for sample in experience.dataset])
        assert model.route(images).tolist() == [expert] * len(images)


def test_s_prompts_takes_the_class_router_too():
    benchmark = class_stream(num_experiences=2)
    strategy = SPrompts(tiny_vit(0), router="ridge", router_width=128, k=2, lr=0.05, train_epochs=4,
                        train_mb_size=16, evaluator=quiet_evaluator())
    assert stream_metric(train_all(strategy, benchmark), "RoutingAcc") == 1.0


@pytest.mark.usefixtures("one_thread")
def test_router_statistics_round_trip_through_a_checkpoint(tmp_path):
    path = tmp_path / "run.ckpt"
    benchmark = class_stream(num_experiences=3, per_class=10)
    strategy = tiny_color(router="ridge", router_width=128, train_epochs=2, k=2)
    train_stream(strategy, benchmark, checkpoint=path)
    stored = read_checkpoint(path).experts
    assert any(key.startswith("router.classifier.") for key in stored)
    fresh = tiny_color(router="ridge", router_width=128, train_epochs=2, k=2)
    ResumePlugin(path).resume(fresh, [[0, 1], [2, 3], [4, 5]])
    for key, value in strategy.model.experts_state_dict().items():
        assert torch.equal(fresh.model.experts_state_dict()[key], value), key
    images = torch.cat([torch.stack([s[0] for s in e.dataset]) for e in benchmark.test_stream])
    assert torch.equal(fresh.model.eval()(images), strategy.model.eval()(images))


def test_a_periodic_evaluation_inside_an_experience_counts_its_samples_once():
    benchmark = class_stream(num_experiences=2, per_class=10)
    plain = tiny_color(router="ridge", router_width=128, train_epochs=2, k=2)
    periodic = tiny_color(router="ridge", router_width=128, train_epochs=2, k=2, eval_every=1)
    for experience in benchmark.train_stream:
        plain.train(experience)
        periodic.train(experience, eval_streams=[benchmark.test_stream])
    ridge, again = plain.model.router.classifier, periodic.model.router.classifier
    torch.testing.assert_close(again.gram, ridge.gram)
    torch.testing.assert_close(again.readout, ridge.readout)


@pytest.mark.parametrize("options, message", [
    (dict(router="knn"), r"router must be one of \('prototypes', 'ridge', 'gaussian', 'oracle'\), got 'knn'"),
    (dict(router_width=0), r"router_width must be an integer >= 1, got 0"),
])
def test_bad_router_options_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        CoLoRConfig.build(**options)


def test_ridge_refuses_a_non_positive_lambda_and_mismatched_inputs():
    with pytest.raises(ValueError, match="ridge must be > 0, got 0.0"):
        solve_ridge(torch.eye(2, dtype=torch.float64), torch.ones(2, 1, dtype=torch.float64), 0.0)
    with pytest.raises(ValueError, match="same, non-zero length, got 3 and 2"):
        RandomFeatureRidge(2, 8).fit(torch.ones(3, 2), torch.zeros(2, dtype=torch.long))
