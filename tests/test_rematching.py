"""HRM-PET's hybrid re-matching (``rematching``, ``rematching_score``, ``rematching_tau``, ``rematching_candidate``).

The reference is a transcription of HRM-PET's ``evaluate`` (github wei-cheng777/HRM-PET,
``engines/hrm_lora_wtp_and_tap_engine.py``), run on the same tiny seeded float64 experts: its task-identity
classifier is the router, its all-class model every expert's head on the chosen expert's features.
"""

from functools import lru_cache
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from avalanche_color import CoLoR, ExpertViT, LoRAExpertsPlugin
from avalanche_color.routing.rematching import RematchingRule, confidence_scores, energy, generalized_entropy
from helpers import UNSATURATED, quiet_evaluator, tiny_color, train_all
from streams import class_stream, tiny_vit
from test_routed_model import backbone_passes
from test_top_m import CLASSES, experts_model, images

NUM_CLASSES = 6


# ---------------------------------------------------------------------- HRM-PET's rule, as its code computes it

def generalized_entropy_hrm(softmax_id_val, gamma, M):  # HRM-PET's, verbatim
    probs = softmax_id_val
    probs_sorted = np.sort(probs, axis=1)[:, -M:]
    scores = np.sum(probs_sorted**gamma * (1 - probs_sorted)**(gamma), axis=1)
    return -scores


def hrm_evaluate_batch(model, original_model, input, task_id, class_mask, target_task_map, args):
    """HRM-PET's ``evaluate`` for one batch, from ``output = original_model(input)`` to the final ``logits``
    (the metric and logging lines left out). Added: ``used``, the task whose LoRA gave each final row."""
    device = input.device
    output = original_model(input)
    logits = output['logits']
    if args.train_mask and class_mask is not None:
        mask = []
        for id in range(task_id + 1):
            mask.extend(class_mask[id])
        not_mask = np.setdiff1d(np.arange(args.nb_classes), mask)
        not_mask = torch.tensor(not_mask, dtype=torch.int64).to(device)
        old_logits = logits.index_fill(dim=1, index=not_mask, value=float('-inf'))

    lora_id = torch.max(old_logits, dim=1)[1]
    lora_id = torch.tensor([target_task_map[v.item()] for v in lora_id], device=device)

    output = model(input, task_id=lora_id)
    logits = output['logits']

    # (HRM-PET's task_inc masking here: off in every config it ships, and off here.)
    if args.train_mask and class_mask is not None:
        mask = []
        for id in range(task_id + 1):
            mask.extend(class_mask[id])
        not_mask = np.setdiff1d(np.arange(args.nb_classes), mask)
        not_mask = torch.tensor(not_mask, dtype=torch.int64).to(device)
        logits = logits.index_fill(dim=1, index=not_mask, value=float('-inf'))
    prompt_id = torch.max(logits, dim=1)[1]

    id_logits = logits
    top_5_values, top_5_indices = torch.topk(id_logits, 2, dim=1)

    task_map_keys = list(target_task_map.keys())
    task_map_values = torch.tensor([target_task_map[k] for k in task_map_keys], device=device)
    task_map_tensor = torch.zeros((max(task_map_keys) + 1,), dtype=torch.long, device=device)
    task_map_tensor[task_map_keys] = task_map_values
    top5_id = torch.index_select(task_map_tensor, 0, top_5_indices.view(-1)).view_as(top_5_indices)

    id_logits = F.softmax(id_logits, dim=1)
    values, _ = torch.topk(id_logits, 1, dim=1)
    if args.En == 'msp':
        low_confidence_indices = torch.where(values < args.tau)[0]
    else:
        softmax_ood = id_logits
        softmax_ood = softmax_ood.cpu().numpy()
        en = generalized_entropy_hrm(softmax_ood, 0.1, 20)
        en = torch.tensor(en)
        en = en.to(device, non_blocking=True)
        low_confidence_indices = torch.where(en < args.tau)[0]

    filtered_index_tensor = low_confidence_indices

    prompt_id = torch.tensor([target_task_map[v.item()] for v in prompt_id], device=device)

    used = lora_id.clone()
    equal_drm = torch.nonzero(prompt_id != lora_id).flatten()
    output_drm = model(input[equal_drm], task_id=prompt_id[equal_drm])
    logits[equal_drm] = output_drm['logits']
    used[equal_drm] = prompt_id[equal_drm]

    if task_id > 0:
        error_prompt_id = prompt_id[filtered_index_tensor]
        error_prompt_id = torch.tensor([target_task_map[v.item()] for v in error_prompt_id], device=device)
        error_input = input[filtered_index_tensor]
        ensemble_id = top5_id[filtered_index_tensor, :2]
        error_output = []
        error_output.append(logits[filtered_index_tensor, :])
        out = model(error_input, task_id=ensemble_id[:, 1])
        error_output.append(out['logits'])

        error_output = torch.stack(error_output, dim=1)

        entropy = (0.1 * torch.logsumexp(error_output / 0.1, dim=2))
        corr_id = torch.max(entropy, dim=1)[1]
        corr = corr_id.unsqueeze(1).unsqueeze(2)
        result = torch.gather(error_output, 1, corr.expand(-1, 1, len(class_mask[0]) * len(class_mask)))

        result = result.squeeze(1)
        logits[filtered_index_tensor] = result
        used[filtered_index_tensor] = torch.where(corr_id == 1, ensemble_id[:, 1], used[filtered_index_tensor])
    return logits, used


def hrm_models(model: ExpertViT):
    """HRM-PET's two models made of ours: the task-identity classifier (class c's logit: the router's score of
    c's expert, so its argmax class's task is the router's expert) and the all-class model (every expert's head
    on the features of the task given, computed one sample at a time)."""
    owner = {c: e for e, classes in enumerate(CLASSES) for c in classes}

    def original_model(x):
        scores = model.router.expert_scores(model.routing_features(x), model.num_experts)
        return {'logits': scores[:, [owner[c] for c in range(NUM_CLASSES)]]}

    def all_class_model(x, task_id):
        logits = torch.full((len(x), NUM_CLASSES), float("-inf"), dtype=torch.float64)
        for task in task_id.unique().tolist():  # each task's samples through its LoRA alone
            rows = (task_id == task).nonzero().flatten()
            pooled = model.features(x[rows], task)
            for head in model.bank.heads:
                logits[rows[:, None], head.classes] = head(pooled)
        return {'logits': logits}

    return original_model, all_class_model, owner


def hrm_reference(model: ExpertViT, x: torch.Tensor, score: str, tau: float):
    original_model, all_class_model, owner = hrm_models(model)
    args = SimpleNamespace(train_mask=True, task_inc=False, nb_classes=NUM_CLASSES, En=score, tau=tau)
    return hrm_evaluate_batch(all_class_model, original_model, x, len(CLASSES) - 1, [list(c) for c in CLASSES],
                              owner, args)


def gen_median(model: ExpertViT, x: torch.Tensor) -> float:
    """A ``"gen"`` threshold that splits the batch: on 6 classes HRM-PET's -10 finds no sample."""
    _, all_class_model, _ = hrm_models(model)
    first = model.route(x)
    probabilities = all_class_model(x, first)['logits'].softmax(1)
    return float(generalized_entropy(probabilities).median())


@lru_cache(maxsize=None)
def trained(router: str = "prototypes", routing_features: str = "backbone") -> ExpertViT:
    """test_top_m's three float64 experts (k-means fitted once per router): the rules are given to ``rematch``."""
    return experts_model(router, routing_features)


# ---------------------------------------------------------------------- the tests

@pytest.mark.parametrize("router, routing_features, score", [
    ("prototypes", "backbone", "msp"), ("prototypes", "backbone", "gen"), ("prototypes", "first_expert", "gen"),
    ("gaussian", "backbone", "msp"), ("ridge", "backbone", "gen")])
def test_hybrid_rematching_is_hrm_pets_rule_on_the_same_experts(router, routing_features, score):
    x = images(24, seed=3)
    model = trained(router, routing_features)
    with torch.no_grad():
        tau = 0.6 if score == "msp" else gen_median(model, x)
        reference, used = hrm_reference(model, x, score, tau)
        rematched = model.rematch(x, rule=RematchingRule("hybrid", score, tau))
    assert torch.equal(rematched.experts, used)
    assert rematched.direct.any() and rematched.low_confidence.any() and not rematched.low_confidence.all()
    assert not torch.equal(rematched.experts, rematched.first)  # re-matching moved some samples
    # The answer is the final expert's own head: HRM-PET's all-class logits on that expert's classes.
    own = torch.isfinite(rematched.logits)
    assert (own.sum(1) == 2).all()
    torch.testing.assert_close(rematched.logits[own], reference[own], rtol=0, atol=1e-12)


def test_the_model_answers_with_the_rematched_expert():
    model = experts_model(rematching="hybrid", rematching_score="msp", rematching_tau=0.6)
    x = images(24, seed=3)
    with torch.no_grad():
        rematched = model.rematch(x)
        logits, routed = model(x, return_experts=True)
    assert torch.equal(logits, rematched.logits) and torch.equal(routed, rematched.experts)
    for i in range(len(x)):
        own = model.predict(x[i : i + 1], int(rematched.experts[i]))[0]
        torch.testing.assert_close(logits[i], own, rtol=0, atol=1e-12)


def test_off_is_the_papers_routing_exactly():
    model = experts_model()
    x = images()
    assert model.rematching is None and model.config.rematching == "off"
    passes = backbone_passes(model)
    with torch.no_grad():
        assert torch.equal(model(x), model.predict(x, model.route(x)))
    assert passes[:2] == [9, 9]  # one routing pass, one expert pass


def test_a_sample_whose_best_class_is_another_experts_gets_that_experts_answer():
    model = trained()
    x = images(24, seed=3)
    _, all_class_model, owner = hrm_models(model)
    with torch.no_grad():
        rematched = model.rematch(x, rule=RematchingRule("direct"))
        first_best = all_class_model(x, rematched.first)['logits'].argmax(1)
        best_expert = torch.tensor([owner[int(c)] for c in first_best])
        assert torch.equal(rematched.direct, best_expert != rematched.first) and rematched.direct.any()
        assert torch.equal(rematched.experts, best_expert)  # direct only: the best class's expert answers
        assert not rematched.low_confidence.any()
        for i in rematched.direct.nonzero().flatten().tolist():
            torch.testing.assert_close(rematched.logits[i], model.predict(x[i : i + 1], int(best_expert[i]))[0],
                                       rtol=0, atol=1e-12)


def test_the_thresholds_extremes():
    model = trained()
    x = images(24, seed=3)
    with torch.no_grad():
        direct = model.rematch(x, rule=RematchingRule("direct"))
        never = model.rematch(x, rule=RematchingRule("hybrid", "msp", 0.0))  # no probability is below 0
        always = model.rematch(x, rule=RematchingRule("hybrid", "msp", 1.0))  # every one is below 1
        hrm_default = model.rematch(x, rule=RematchingRule("hybrid", "gen", -10.0))  # 6 classes: never below -10
        every_gen = model.rematch(x, rule=RematchingRule("hybrid", "gen", 0.0))  # every GEN score is below 0
    for rematched in (never, hrm_default):
        assert not rematched.low_confidence.any()
        assert torch.equal(rematched.experts, direct.experts) and torch.equal(rematched.logits, direct.logits)
    assert always.low_confidence.all() and every_gen.low_confidence.all()
    assert torch.equal(always.experts, every_gen.experts)  # the same candidates, the same energies


def test_confidence_only_keeps_confident_samples_and_takes_the_candidate_of_larger_energy():
    x = images(24, seed=3)
    model = trained()
    _, all_class_model, owner = hrm_models(model)
    for candidate in ("class", "router"):
        with torch.no_grad():
            rematched = model.rematch(x, rule=RematchingRule("confidence", "msp", 0.6, candidate))
            first = all_class_model(x, rematched.first)['logits']
            if candidate == "class":
                second = torch.tensor([owner[int(c)] for c in first.topk(2, dim=1).indices[:, 1]])
            else:
                second = model.propose(x, m=2).experts[:, 1]
            other = all_class_model(x, second)['logits']
        low = rematched.low_confidence
        assert torch.equal(low, first.softmax(1).amax(1) < 0.6) and low.any() and not low.all()
        assert not rematched.direct.any()
        assert torch.equal(rematched.experts[~low], rematched.first[~low])
        take = energy(other) > energy(first)
        assert torch.equal(rematched.experts[low], torch.where(take, second, rematched.first)[low])


def test_the_scores_are_hrm_pets():
    generator = torch.Generator().manual_seed(0)
    probabilities = torch.randn(5, 30, generator=generator, dtype=torch.float64).softmax(1)
    torch.testing.assert_close(generalized_entropy(probabilities),
                               torch.from_numpy(generalized_entropy_hrm(probabilities.numpy(), 0.1, 20)))
    torch.testing.assert_close(confidence_scores(probabilities, "msp"), probabilities.amax(1))
    logits = torch.tensor([[1.0, 2.0, float("-inf")]], dtype=torch.float64)
    torch.testing.assert_close(energy(logits), 0.1 * torch.logsumexp(logits / 0.1, dim=1))


def test_one_expert_is_never_rematched():
    model = ExpertViT(tiny_vit().double(), rank=2, rematching="hybrid", rematching_score="msp", rematching_tau=1.0)
    model.start_expert([0, 1])
    model.router.fit(0, torch.randn(6, 32, dtype=torch.float64), torch.tensor([0, 1] * 3))
    model.eval()
    x = images(4)
    with torch.no_grad():
        torch.testing.assert_close(model(x), model.predict(x, 0), rtol=0, atol=1e-12)


def test_on_a_domain_stream_only_the_routers_candidate_applies():
    # Every expert has every class: HRM-PET's class-to-task map names no task, so the direct step and the
    # "class" candidate leave each sample with the router's expert; the router's second-ranked expert still runs.
    model = ExpertViT(tiny_vit().double(), rank=2)
    generator = torch.Generator().manual_seed(4)
    for expert in range(3):
        model.start_expert([0, 1, 2], experience=expert)
        with torch.no_grad():
            for parameter in model.expert_parameters(expert):
                parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator, dtype=torch.float64))
        model.router.fit(expert, torch.randn(9, 32, generator=generator, dtype=torch.float64) + expert,
                         torch.tensor([0, 1, 2] * 3))
        model.finish_expert(expert)
    model.eval()
    x = images(12)
    with torch.no_grad():
        routed = model.route(x)
        hybrid = model.rematch(x, rule=RematchingRule("hybrid", "msp", 1.0))
        by_router = model.rematch(x, rule=RematchingRule("hybrid", "msp", 1.0, "router"))
        second = model.propose(x, m=2).experts[:, 1]
    assert not hybrid.direct.any() and not hybrid.low_confidence.any()
    assert torch.equal(hybrid.experts, routed)
    assert by_router.low_confidence.all() and not by_router.direct.any()
    assert ((by_router.experts == routed) | (by_router.experts == second)).all()
    assert (by_router.experts == second).any()


def test_the_evaluation_cache_gives_the_same_answers():
    options = dict(rematching="hybrid", rematching_score="msp", rematching_tau=0.6)
    cached, plain = experts_model(cache_evaluation=True, **options), experts_model(**options)
    x = images(24, seed=3)
    with torch.no_grad():
        (first, cached_experts), again, (reference, plain_experts) = (cached(x, return_experts=True), cached(x),
                                                                      plain(x, return_experts=True))
    torch.testing.assert_close(first, reference, rtol=0, atol=1e-12)
    assert torch.equal(again, first) and cached.eval_cache.hits > 0
    assert torch.equal(cached_experts, plain_experts)


def test_a_strategy_with_rematching_evaluates_with_it_and_saves_and_loads_it(tmp_path):
    benchmark = class_stream(num_experiences=2)
    options = dict(rematching="hybrid", rematching_score="msp", rematching_tau=0.9, rematching_candidate="router")
    strategy = tiny_color(**options, **UNSATURATED)
    train_all(strategy, benchmark)  # training never routes: the experts are CoLoR's
    x = torch.cat([torch.stack([s[0] for s in e.dataset]) for e in benchmark.test_stream])
    model = strategy.model.eval()
    folder = model.save_pretrained(tmp_path / "rematched")
    loaded = ExpertViT.from_pretrained(folder, tiny_vit())
    assert loaded.rematching == RematchingRule("hybrid", "msp", 0.9, "router")
    with torch.no_grad():
        (loaded_logits, loaded_experts), (logits, experts) = loaded(x, return_experts=True), model(x, return_experts=True)
        assert torch.equal(loaded_logits, logits) and torch.equal(loaded_experts, experts)
        assert torch.equal(model.rematch(x).experts, experts)
    assert ExpertViT.from_pretrained(folder, tiny_vit(), rematching="off").rematching is None  # not an expert setting


def test_the_drop_in_plugin_gives_its_model_the_rule():
    plugin = LoRAExpertsPlugin(rank=2, rematching="confidence", rematching_score="msp", rematching_tau=0.5)
    assert ExpertViT(tiny_vit(), plugin.config).rematching == RematchingRule("confidence", "msp", 0.5, "class")
    with pytest.raises(ValueError, match="rematching_tau must be a number in"):
        LoRAExpertsPlugin(rematching="hybrid", rematching_score="msp", rematching_tau=2.0)


@pytest.mark.parametrize("options, says", [
    (dict(rematching="both"), "rematching must be one of .*got 'both'"),
    (dict(rematching_score="entropy"), "rematching_score must be one of .*got 'entropy'"),
    (dict(rematching_tau=float("nan")), "rematching_tau must be a finite number, got nan"),
    (dict(rematching_tau="low"), "rematching_tau must be a finite number, got 'low'"),
    (dict(rematching_candidate="third"), "rematching_candidate must be one of .*got 'third'"),
    (dict(rematching="hybrid", rematching_score="msp"), r"rematching_tau must be a number in \[0, 1\] with "
                                                        r"rematching_score='msp'.*got -10.0"),
    (dict(rematching="direct", router="oracle"), "rematching='direct' .* router='oracle'"),
    (dict(rematching="hybrid", top_m=2), "rematching='hybrid' and top_m=2"),
])
def test_bad_values_are_refused_by_name(options, says):
    with pytest.raises(ValueError, match=says):
        CoLoR(tiny_vit(), evaluator=quiet_evaluator(), **options)


def test_a_bad_rule_is_refused_by_name():
    with pytest.raises(ValueError, match="rematching must be one of .*got 'off'"):
        RematchingRule("off")
    with pytest.raises(ValueError, match="rematch needs a rule"):
        trained().rematch(images())
