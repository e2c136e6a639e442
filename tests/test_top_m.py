"""Top-m routing (``top_m``, ``top_m_rule``): the router's m best experts per sample run as one mixed batch, a
rule picks the answer. Each candidate row is that expert's own run on its sample; m=1 is the router's choice."""

import pytest
import torch

from avalanche_color import CoLoR, ExpertViT
from avalanche_color.experts.routed_vit import Candidates, candidate_merit, top_candidates
from avalanche_color.routing.routers import kmeans_clustering
from helpers import UNSATURATED, quiet_evaluator, tiny_color, train_all
from streams import class_stream, tiny_vit
from test_routed_model import backbone_passes

CLASSES = ([0, 1], [2, 3], [4, 5])


def experts_model(router: str = "prototypes", routing_features: str = "backbone", **options) -> ExpertViT:
    """A float64 ExpertViT with three experts of random LoRA weights and heads, its router fitted on random
    features of each expert's images, every expert finished."""
    model = ExpertViT(tiny_vit().double(), rank=2, router=router, routing_features=routing_features,
                      router_width=64, **options)
    generator = torch.Generator().manual_seed(1)
    for expert, classes in enumerate(CLASSES):
        model.start_expert(classes, experience=expert)
        with torch.no_grad():
            for parameter in model.expert_parameters(expert):
                parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator, dtype=torch.float64))
        images = torch.randn(12, 3, 16, 16, generator=generator, dtype=torch.float64) + expert
        labels = torch.tensor(classes).repeat(6)
        with torch.no_grad():
            model.router.fit(expert, model.routing_features(images), labels, clustering=kmeans_clustering(2))
        model.finish_expert(expert)
    return model.eval()


def images(count: int = 9, seed: int = 2) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(count, 3, 16, 16, generator=generator, dtype=torch.float64) + torch.arange(count).remainder(3)[
        :, None, None, None].double()


@pytest.mark.parametrize("router, routing_features", [("prototypes", "backbone"), ("prototypes", "first_expert"),
                                                      ("ridge", "backbone"), ("gaussian", "backbone")])
def test_each_candidate_row_is_that_experts_own_run_and_the_first_is_the_routers_choice(router, routing_features):
    model = experts_model(router, routing_features)
    x = images()
    with torch.no_grad():
        candidates = model.propose(x, m=3)
        assert candidates.experts.shape == (9, 3) and candidates.logits.shape == (9, 3, 6)
        assert torch.equal(candidates.experts[:, 0], model.route(x))  # column 0: the router's own choice
        assert (candidates.scores[:, :-1] >= candidates.scores[:, 1:]).all()  # best first
        assert sorted(candidates.experts[0].tolist()) == [0, 1, 2]
        for i in range(len(x)):
            for j in range(3):
                own = model.predict(x[i : i + 1], int(candidates.experts[i, j]))[0]
                torch.testing.assert_close(candidates.logits[i, j], own, rtol=0, atol=1e-12)


def test_m_one_is_the_routers_choice_and_the_default_forward_is_unchanged():
    model = experts_model()
    x = images()
    with torch.no_grad():
        plain = model.predict(x, model.route(x))
        assert torch.equal(model(x), plain)  # top_m=1, the default: the router's expert, computed as before
        logits, experts = model.propose(x, m=1).pick("confidence")
    assert torch.equal(experts, model.route(x))
    torch.testing.assert_close(logits, plain, rtol=0, atol=1e-12)


@pytest.mark.parametrize("rule", ["router_product", "confidence"])
def test_the_model_answers_with_the_candidate_the_rule_prefers(rule):
    model = experts_model(top_m=3, top_m_rule=rule)
    x = images()
    with torch.no_grad():
        candidates = model.propose(x)
        merit = candidate_merit(candidates.logits, candidates.scores, rule)
        logits, routed = model(x, return_experts=True)
    best = merit.argmax(dim=1)
    assert torch.equal(routed, candidates.experts[torch.arange(len(x)), best])
    assert torch.equal(logits, candidates.logits[torch.arange(len(x)), best])
    assert (merit.gather(1, best[:, None]) >= merit).all()
    assert not torch.equal(routed, model.route(x))  # the rule overrules the router somewhere


def test_the_rules_measure_what_they_say():
    logits = torch.tensor([[[2.0, 0.0, float("-inf")], [0.0, 0.0, 0.0]]])  # (1 sample, 2 candidates, 3 classes)
    scores = torch.tensor([[0.0, 5.0]])
    confidence = candidate_merit(logits, scores, "confidence")
    torch.testing.assert_close(confidence, torch.tensor([[torch.tensor([2.0, 0.0]).softmax(0)[0].item(), 1 / 3]]))
    product = candidate_merit(logits, scores, "router_product")
    torch.testing.assert_close(product, confidence * scores.softmax(1))
    # The picked answer: the first candidate by confidence, the second by the router's product.
    pair = Candidates(torch.tensor([[4, 7]]), scores, logits)
    assert pair.pick("confidence")[1].tolist() == [4] and pair.pick("router_product")[1].tolist() == [7]
    for gone in ("vote", "entropy"):
        with pytest.raises(ValueError, match=f"top_m_rule must be one of .*got '{gone}'"):
            candidate_merit(logits, scores, gone)


def test_experts_the_router_does_not_know_are_never_candidates():
    scores = torch.tensor([[0.5, float("-inf"), 0.75], [float("-inf"), 0.25, float("-inf")]])
    experts, best = top_candidates(scores, 3)
    assert experts.tolist() == [[2, 0, 2], [1, 1, 1]]
    assert best.tolist() == [[0.75, 0.5, 0.75], [0.25, 0.25, 0.25]]


def test_one_routing_pass_then_one_pass_of_m_times_the_batch():
    model = experts_model(top_m=2)
    passes = backbone_passes(model)
    with torch.no_grad():
        model(images(5))
    assert passes == [5, 10]


def test_more_candidates_than_experts_runs_them_all():
    model = experts_model(top_m=5)
    with torch.no_grad():
        candidates = model.propose(images())
    assert candidates.experts.shape == (9, 3)


def test_the_evaluation_cache_gives_the_same_answers():
    cached, plain = experts_model(top_m=2, cache_evaluation=True), experts_model(top_m=2)
    x = images()
    with torch.no_grad():
        (first, cached_experts), again, (reference, plain_experts) = (cached(x, return_experts=True), cached(x),
                                                                      plain(x, return_experts=True))
    torch.testing.assert_close(first, reference, rtol=0, atol=1e-12)
    assert torch.equal(again, first) and cached.eval_cache.hits > 0
    assert torch.equal(cached_experts, plain_experts)


def test_a_strategy_with_top_m_trains_as_colors_and_saves_and_loads_it(tmp_path):
    benchmark = class_stream(num_experiences=3)
    reference = tiny_color(**UNSATURATED)
    train_all(reference, benchmark)
    strategy = tiny_color(top_m=2, top_m_rule="confidence", **UNSATURATED)
    train_all(strategy, benchmark)
    state, same = strategy.model.experts_state_dict(), reference.model.experts_state_dict()
    assert state.keys() == same.keys() and all(torch.equal(state[k], same[k]) for k in state)
    x = torch.cat([torch.stack([s[0] for s in e.dataset]) for e in benchmark.test_stream])
    model = strategy.model.eval()
    folder = model.save_pretrained(tmp_path / "top2")
    loaded = ExpertViT.from_pretrained(folder, tiny_vit())
    assert (loaded.top_m, loaded.top_m_rule) == (2, "confidence")
    with torch.no_grad():
        (loaded_logits, loaded_experts), (logits, experts) = loaded(x, return_experts=True), model(x, return_experts=True)
        assert torch.equal(loaded_logits, logits) and torch.equal(loaded_experts, experts)
    assert ExpertViT.from_pretrained(folder, tiny_vit(), top_m=1).top_m == 1  # not an expert setting


@pytest.mark.parametrize("options, says", [
    (dict(top_m=0), "top_m must be an integer >= 1, got 0"),
    (dict(top_m=2.0), "top_m must be an integer >= 1, got 2.0"),
    (dict(top_m_rule="vote"), "top_m_rule must be one of .*got 'vote'"),
    (dict(top_m=2, router="oracle"), "top_m=2 .* router='oracle'"),
])
def test_bad_values_are_refused_by_name(options, says):
    with pytest.raises(ValueError, match=says):
        CoLoR(tiny_vit(), evaluator=quiet_evaluator(), **options)
