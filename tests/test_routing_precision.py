"""Routers under autocast compute in full precision, and the Gaussian router's fit is deterministic."""

from __future__ import annotations

import pytest
import torch

from avalanche_color.routing.routers import ClassRouter, PrototypeRouter
from avalanche_color.routing.classifiers import GaussianClassifier
from avalanche_color.utils.precision import full_precision

WIDTH = 64


def blobs(seed: int = 0, experts: int = 4, per: int = 300, classes: int = 3):
    """Close Gaussian blobs (many samples near a decision boundary), labelled by expert and class."""
    generator = torch.Generator().manual_seed(seed)
    centres = 0.3 * torch.randn(experts, classes, WIDTH, generator=generator)
    features, expert_of, labels = [], [], []
    for expert in range(experts):
        label = torch.arange(classes).repeat(per // classes)
        features.append(centres[expert, label] + torch.randn(len(label), WIDTH, generator=generator))
        expert_of.append(torch.full_like(label, expert))
        labels.append(label)
    return torch.cat(features), torch.cat(expert_of), torch.cat(labels)


def fitted(kind: str) -> torch.nn.Module:
    features, experts, labels = blobs()
    if kind in ("euclidean", "l1", "cosine"):
        router = PrototypeRouter(kind)
        for expert in experts.unique().tolist():
            router.set_prototypes(expert, features[experts == expert][:20])  # many close prototypes
        return router
    router = ClassRouter(kind, WIDTH, 256)
    for expert in experts.unique().tolist():
        router.fit(expert, features[experts == expert], labels[experts == expert])
        router.finish(expert)
    return router


@pytest.mark.parametrize("kind", ["euclidean", "l1", "cosine", "ridge", "gaussian"])
def test_routing_under_bfloat16_autocast_equals_float32_routing(kind):
    router = fitted(kind)
    features = blobs(seed=1)[0]
    expected = router(features)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        routed = router(features)
        assert torch.is_autocast_enabled("cpu")  # the router switched it off for itself only
    assert torch.equal(routed, expected)
    if kind in ("ridge", "gaussian"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            scores = router.pair_scores(features)
        assert scores.dtype == torch.float32 and torch.equal(scores, router.pair_scores(features))


def test_without_full_precision_bfloat16_would_change_routes():
    # What the test above guards against: the same scores computed under autocast pick other experts.
    router = fitted("gaussian")
    features = blobs(seed=1)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        product = features @ router.classifier.weight
    assert product.dtype == torch.bfloat16
    low = (product + router.classifier.bias)[:, : len(router.pair_experts)]
    assert not torch.equal(router.pair_experts[low.argmax(dim=1)], router(features))


@pytest.mark.parametrize("kind", ["ridge", "gaussian"])
def test_fitting_under_autocast_gives_the_float32_fit(kind):
    expected = fitted(kind)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under_autocast = fitted(kind)
    for name, value in expected.state_dict().items():
        assert torch.equal(value, under_autocast.state_dict()[name]), name


def test_full_precision_restores_the_callers_autocast():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with full_precision():
            assert not torch.is_autocast_enabled("cpu")
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
        assert torch.is_autocast_enabled("cpu")
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16


# ---------------------------------------------------------------------- a deterministic Gaussian fit


def test_the_gaussian_fit_sums_by_one_hot_matmul_not_index_add(monkeypatch):
    features, _, labels = blobs(experts=1)
    reference = GaussianClassifier(WIDTH)
    reference.fit(features, labels)

    def refused(*args, **kwargs):
        raise AssertionError("index_add adds with atomics in no fixed order on CUDA")

    monkeypatch.setattr(torch.Tensor, "index_add", refused)
    monkeypatch.setattr(torch.Tensor, "index_add_", refused)
    monkeypatch.setattr(torch, "index_add", refused)
    again = GaussianClassifier(WIDTH)
    again.fit(features, labels)
    for name, value in reference.state_dict().items():
        assert torch.equal(value, again.state_dict()[name]), name
    # The sums are those index_add gives (up to the order of float64 additions).
    monkeypatch.undo()
    counts = torch.zeros(3, dtype=torch.float64).index_add(0, labels, torch.ones(len(labels), dtype=torch.float64))
    sums = torch.zeros(3, WIDTH, dtype=torch.float64).index_add(0, labels, features.double())
    assert torch.equal(reference.counts, counts)
    torch.testing.assert_close(reference.sums, sums, rtol=1e-12, atol=1e-12)


@pytest.mark.cuda
def test_the_gaussian_fit_is_bit_identical_on_cuda_under_deterministic_algorithms():
    # torch raises for an op without a deterministic CUDA implementation (index_add did).
    features, experts, labels = (t.cuda() for t in blobs())
    torch.use_deterministic_algorithms(True, warn_only=False)
    try:
        fits = []
        for _ in range(3):
            router = ClassRouter("gaussian", WIDTH, 256).cuda()
            for expert in range(4):
                router.fit(expert, features[experts == expert], labels[experts == expert])
                router.finish(expert)
            fits.append(router.state_dict())
    finally:
        torch.use_deterministic_algorithms(False)
    for other in fits[1:]:
        assert all(torch.equal(value, other[name]) for name, value in fits[0].items())
