"""A variant of CoLoR evaluated on CoLoR's trained experts gives what training it would have given."""

import pytest
import torch
from avalanche.training.determinism.rng_manager import RNGManager

from avalanche_color import SPrompts, evaluate_trained_experts, train_stream
from helpers import quiet_evaluator, tiny_color
from streams import class_stream, domain_stream, tiny_vit

pytestmark = pytest.mark.usefixtures("one_thread")

# Each differs from CoLoR in how it routes alone, as the runner's variants do.
VARIANTS = {
    "oracle": dict(router="oracle"),
    "gaussian": dict(router="gaussian"),
    "ridge": dict(router="ridge", router_width=64),
    "first expert's features": dict(routing_features="first_expert"),
    "top-2": dict(top_m=2),
    "re-matching": dict(rematching="hybrid"),
}


def seeded_color(**options):
    RNGManager.set_random_seeds(0)  # as the runner seeds each run before building its strategy
    return tiny_color(k=2, train_epochs=2, cache_evaluation=True, **options)


@pytest.fixture(scope="module")
def trained_color():
    """CoLoR trained on 3 domains close together, with task labels (the oracle needs them): its prototypes route
    about half the test images right (the Gaussian router nearly all), so routers have room to differ."""
    benchmark = domain_stream(num_domains=3, shift=0.1, task_labels=True)
    strategy = seeded_color()
    records = train_stream(strategy, benchmark)
    assert 0.3 < records[-1]["RoutingAcc_Stream/eval_phase/test_stream/Task002"] < 0.8
    return strategy, records, benchmark


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_variant_on_colors_trained_experts_matches_the_variant_trained(trained_color, variant):
    trained, _, benchmark = trained_color
    alone = seeded_color(**VARIANTS[variant])
    expected = train_stream(alone, benchmark)
    followed = evaluate_trained_experts(seeded_color(**VARIANTS[variant]), trained, benchmark)
    assert followed == expected


def test_warm_started_experts_are_followed_alike(trained_color):
    _, _, benchmark = trained_color
    warm = seeded_color(warm_start=True)
    train_stream(warm, benchmark)
    expected = train_stream(seeded_color(warm_start=True, router="gaussian"), benchmark)
    assert evaluate_trained_experts(seeded_color(warm_start=True, router="gaussian"), warm, benchmark) == expected


def test_colors_own_router_reproduces_its_records_and_leaves_the_trained_model_as_it_was(trained_color):
    trained, records, benchmark = trained_color
    before = {key: value.clone() for key, value in trained.model.experts_state_dict().items()}
    assert evaluate_trained_experts(seeded_color(), trained, benchmark) == records
    after = trained.model.experts_state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[key], after[key]) for key in before)


def test_refuses_a_trained_strategy_of_another_kind_an_untrained_one_and_a_shorter_stream(trained_color):
    trained, _, benchmark = trained_color
    prompts = SPrompts(tiny_vit(0), k=2, train_epochs=1, train_mb_size=16, evaluator=quiet_evaluator())
    with pytest.raises(TypeError, match="trained's model is a ExpertViT, strategy's a PromptExpertViT"):
        evaluate_trained_experts(prompts, trained, benchmark)
    with pytest.raises(ValueError, match=r"trained's experts have other shapes.*rank=4 against 8"):
        evaluate_trained_experts(seeded_color(rank=8), trained, benchmark)
    with pytest.raises(ValueError, match="trained must have finished one expert per experience of the stream"):
        evaluate_trained_experts(seeded_color(), seeded_color(), benchmark)
    longer = domain_stream(num_domains=4, shift=0.1, task_labels=True)
    with pytest.raises(ValueError, match=r"the stream has 4, trained's experts come from experiences \[0, 1, 2\]"):
        evaluate_trained_experts(seeded_color(), trained, longer)


def test_a_stream_with_other_classes_is_refused(trained_color):
    trained, _, _ = trained_color
    other = class_stream(num_experiences=3)
    with pytest.raises(ValueError, match=r"experience 0's classes are \[0, 1\] in strategy's stream, \[0, 1, 2\]"):
        evaluate_trained_experts(seeded_color(), trained, other)


# ---------------------------------------------------------------------- in the runner

VARIANT_METHODS = ("CoLoR-oracle", "CoLoR-gaussian", "CoLoR-top2")


def comparison(folder, backbone, methods, **settings):
    from avalanche_color.runner import RunConfig, run_comparison

    config = RunConfig(benchmark="digits_domain", methods=methods, epochs=1, batch_size=64, backbone=backbone,
                       out=folder, ranks=(2,), loggers=(), seeds=(0,), **settings)
    return {run["label"]: run for run in run_comparison(config, progress=False)["runs"]}


def same_results(run, other):
    fields = ("accuracy_matrix", "average_accuracy", "forgetting", "routing_accuracy", "lr",
              "trainable_parameters_per_experience")
    return {field: run[field] for field in fields} == {field: other[field] for field in fields}


@pytest.fixture(scope="module")
def variants_alone(tiny_backbone, tmp_path_factory):
    """The variants in a comparison without CoLoR: each trains its own experts."""
    return comparison(tmp_path_factory.mktemp("alone"), tiny_backbone, VARIANT_METHODS)


def test_a_comparison_evaluates_colors_variants_on_colors_experts_with_the_results_of_training_each(
        tiny_backbone, tmp_path, variants_alone):
    runs = comparison(tmp_path, tiny_backbone, ("CoLoR", *VARIANT_METHODS))
    assert list(runs) == ["CoLoR", *VARIANT_METHODS]  # the plan's order
    for label in VARIANT_METHODS:
        assert same_results(runs[label], variants_alone[label]), label
        assert runs[label]["trained_by"] == "CoLoR" and "trained_by" not in variants_alone[label]
    assert "trained_by" not in runs["CoLoR"]
    accuracies = {runs[label]["average_accuracy"] for label in runs}
    assert len(accuracies) > 1  # the routers do differ here


def test_an_interrupted_comparison_resumes_the_followers_from_colors_checkpoint(tiny_backbone, tmp_path,
                                                                                variants_alone, monkeypatch):
    from avalanche_color.runner import comparison as module

    real, trained = module.run_method, []

    def interrupted(planned, *arguments, follow=None, **options):
        if follow is not None and trained:
            raise RuntimeError("interrupted after the first follower")
        if follow is not None:
            trained.append(planned.label)
        return real(planned, *arguments, follow=follow, **options)

    monkeypatch.setattr(module, "run_method", interrupted)
    with pytest.raises(RuntimeError, match="interrupted after the first follower"):
        comparison(tmp_path, tiny_backbone, ("CoLoR", *VARIANT_METHODS))
    monkeypatch.undo()
    color = (tmp_path / "attempt" / "runs" / "CoLoR_seed0.json").read_text()
    runs = comparison(tmp_path, tiny_backbone, ("CoLoR", *VARIANT_METHODS), resume=True)
    assert trained == ["CoLoR-oracle"]
    for label in VARIANT_METHODS:
        assert same_results(runs[label], variants_alone[label]), label
    assert (tmp_path / "runs" / "CoLoR_seed0.json").read_text() == color  # its training's record, not rewritten


def test_a_variant_given_another_learning_rate_trains_its_own_experts(tiny_backbone, tmp_path):
    from avalanche_color.runner.comparison import followed_runs
    from avalanche_color.runner.run import LearningRate, PlannedRun

    color, oracle, naive = (PlannedRun("CoLoR", "CoLoR", 0, 2, 5), PlannedRun("CoLoR-oracle", "CoLoR-oracle", 0, 2, 5),
                            PlannedRun("Naive", "Naive", 0, None, None))
    other_seed = oracle._replace(seed=1)
    plan = [color, oracle, other_seed, naive]
    same = {run: None for run in plan}
    assert followed_runs(plan, same) == {oracle: color}
    tuned = {**same, color: LearningRate(0.01, "tuned"), oracle: LearningRate(0.03, "tuned")}
    assert followed_runs(plan, tuned) == {}
