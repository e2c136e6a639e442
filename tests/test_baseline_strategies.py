"""The baselines as a user imports them (avalanche_color.baselines): RanPAC, NCM, Joint-LoRA and FT-masked's plugin.

Each is checked against what it computes written out here (a ridge solved by hand, the nearest
normalised class mean), on tiny seeded ViTs and synthetic streams (seconds on CPU), and against the
comparison runner's build of the same method.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
from avalanche.models import IncrementalClassifier
from torch import nn

from avalanche_color import CoLoRConfig, DataChecksPlugin
from avalanche_color.baselines import NCM, CurrentClassesMasking, JointLoRA, RanPAC
from avalanche_color.baselines.options import BaselineOptions, JointLoRAOptions, RanPACOptions
from avalanche_color.runner import RunConfig
from avalanche_color.runner.backbone_loading import with_head
from avalanche_color.runner.run import build_method
from helpers import quiet_evaluator
from streams import class_stream, domain_stream, tiny_vit

WIDTH = 64  # random features: enough for the tiny ViT's 32-wide features, a solve of no cost


def training_data(experiences) -> tuple[torch.Tensor, torch.Tensor]:
    data = [experience.dataset[i] for experience in experiences for i in range(len(experience.dataset))]
    return torch.stack([x for x, *_ in data]), torch.tensor([int(y) for _, y, *_ in data])


def images_of(experience) -> torch.Tensor:
    return torch.stack([sample[0] for sample in experience.dataset])


def trained(strategy, experiences):
    for experience in experiences:
        strategy.train(experience)
    return strategy.model.eval()


def test_ranpac_scores_are_a_ridge_solved_by_hand_on_the_random_features(one_thread):
    benchmark = class_stream(num_experiences=2, classes_per_experience=2, seed=5)
    vit = tiny_vit()
    model = trained(RanPAC(vit, width=WIDTH, seed=3, evaluator=quiet_evaluator()), benchmark.train_stream)
    x, y = training_data(benchmark.train_stream)
    test = images_of(benchmark.test_stream[1])
    with torch.no_grad():
        vit.eval()
        projection = torch.randn(32, WIDTH, generator=torch.Generator().manual_seed(3))  # the seeded projection
        h = torch.relu(vit(x) @ projection).double()
        ridge = float(model.ridge.ridge)  # λ, chosen on held-out data by the last fit
        readout = torch.linalg.solve(h.T @ h + ridge * torch.eye(WIDTH, dtype=torch.float64),
                                     h.T @ nn.functional.one_hot(y).double())
        expected = torch.relu(vit(test) @ projection).double() @ readout
        scores = model(test)
    assert ridge > 0 and scores.shape == (len(test), 4)
    torch.testing.assert_close(scores.double(), expected, rtol=1e-4, atol=1e-4)
    assert torch.equal(scores.argmax(dim=1), expected.argmax(dim=1))


def test_ncm_scores_are_the_distances_to_the_normalised_class_means(one_thread):
    """A domain-incremental stream: every class comes back, its mean is over all its samples seen."""
    benchmark = domain_stream(num_domains=2, num_classes=3, seed=6)
    vit = tiny_vit()
    model = trained(NCM(vit, evaluator=quiet_evaluator()), benchmark.train_stream)
    x, y = training_data(benchmark.train_stream)
    test = images_of(benchmark.test_stream[0])
    with torch.no_grad():
        vit.eval()
        features = nn.functional.normalize(vit(x), dim=-1)
        means = torch.stack([nn.functional.normalize(features[y == c].mean(dim=0), dim=0) for c in range(3)])
        queries = nn.functional.normalize(vit(test), dim=-1)
        expected = -torch.cdist(queries, means)
        scores = model(test)
    torch.testing.assert_close(scores, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(scores.argmax(dim=1), expected.argmax(dim=1))


@pytest.mark.parametrize("strategy_class", [RanPAC, NCM])
def test_a_class_not_trained_yet_scores_minus_infinity(strategy_class, one_thread):
    benchmark = class_stream(num_experiences=2, classes_per_experience=2, seed=7)
    options = dict(width=WIDTH) if strategy_class is RanPAC else {}
    strategy = strategy_class(tiny_vit(), **options, evaluator=quiet_evaluator())
    strategy.train(benchmark.train_stream[0])
    # Evaluating the whole stream adapts the scores to classes 2 and 3 (no class count is given).
    metrics = strategy.eval(benchmark.test_stream)
    assert metrics["Top1_Acc_Stream/eval_phase/test_stream/Task000"] == pytest.approx(0.5, abs=0.1)
    with torch.no_grad():
        scores = strategy.model(images_of(benchmark.test_stream[1]))
    assert scores.shape[1] == 4 and torch.isneginf(scores[:, 2:]).all() and torch.isfinite(scores[:, :2]).all()
    strategy.train(benchmark.train_stream[1])
    with torch.no_grad():
        assert torch.isfinite(strategy.model(images_of(benchmark.test_stream[1]))).all()


@pytest.mark.parametrize("method", ["RanPAC", "NCM"])
def test_the_runner_builds_the_strategy_a_user_imports(method, one_thread):
    benchmark = class_stream(num_experiences=2, classes_per_experience=2, seed=8)
    vit = tiny_vit()
    config = RunConfig(benchmark="digits_class", batch_size=16, ridge_width=WIDTH)
    runner = build_method(method, config, lambda classes: with_head(copy.deepcopy(vit), classes), 4)
    options = dict(train_mb_size=16)  # the runner's batch: the features are summed in the same batches
    user = RanPAC(vit, width=WIDTH, **options) if method == "RanPAC" else NCM(vit, **options)
    assert type(runner) is type(user)
    test = images_of(benchmark.test_stream[1])
    for strategy in (runner, user):
        trained(strategy, benchmark.train_stream)
    with torch.no_grad():
        assert torch.equal(runner.model(test), user.model(test))


BUILDERS = {"RanPAC": lambda vit, **options: RanPAC(vit, **{"width": WIDTH, **options}),
            "NCM": lambda vit, **options: NCM(vit, **options),
            "JointLoRA": lambda vit, **options: JointLoRA(vit, **{"num_classes": 4, "rank": 2, **options})}
CONFIGS = {"RanPAC": RanPACOptions, "NCM": BaselineOptions, "JointLoRA": JointLoRAOptions}


@pytest.mark.parametrize("name", BUILDERS)
def test_the_model_given_is_not_changed_and_the_data_checks_come_first(name):
    vit = tiny_vit()
    before = copy.deepcopy(vit.state_dict())
    extra = DataChecksPlugin()
    plugins = [extra]
    strategy = BUILDERS[name](vit, plugins=plugins)
    assert all(p.requires_grad for p in vit.parameters()) and vit.training  # a copy is frozen
    assert all(torch.equal(before[k], v) for k, v in vit.state_dict().items())
    assert isinstance(strategy.plugins[0], DataChecksPlugin) and strategy.plugins[0] is not extra
    assert plugins == [extra] and extra in strategy.plugins  # the list is copied, not appended to


def test_bad_data_is_refused_before_the_classifier_changes(one_thread):
    benchmark = class_stream(num_experiences=2, classes_per_experience=2, seed=9)
    strategy = RanPAC(tiny_vit(), width=WIDTH, evaluator=quiet_evaluator())
    strategy.train(benchmark.train_stream[0])
    readout = strategy.model.ridge.readout.clone()
    bad = benchmark.train_stream[1]
    bad.dataset[3][0][0, 0, 0] = float("nan")  # the tensors are the stream's own: one pixel made NaN
    with pytest.raises(ValueError, match="experience 1, sample 3: images must have finite pixels"):
        strategy.train(bad)
    assert torch.equal(strategy.model.ridge.readout, readout)


def test_joint_lora_scans_every_experience_before_training(one_thread):
    benchmark = class_stream(num_experiences=2, classes_per_experience=2, seed=9)
    strategy = JointLoRA(tiny_vit(), num_classes=4, rank=2, train_epochs=1, evaluator=quiet_evaluator())
    benchmark.train_stream[1].dataset[5][0][0, 0, 0] = float("inf")
    before = copy.deepcopy(strategy.model.state_dict())
    with pytest.raises(ValueError, match="experience 1, sample 5: images must have finite pixels"):
        strategy.train(benchmark.train_stream)
    assert all(torch.equal(before[k], v) for k, v in strategy.model.state_dict().items())


def test_joint_lora_defaults_are_colors():
    strategy = JointLoRA(tiny_vit(), num_classes=3)
    color = CoLoRConfig()
    group = strategy.optimizer.param_groups[0]
    assert (group["lr"], group["momentum"], group["weight_decay"]) == (color.lr, color.momentum, color.weight_decay)
    assert (strategy.model.experts.rank, strategy.train_mb_size, strategy.train_epochs) == (
        color.rank, color.train_mb_size, color.train_epochs)
    assert strategy.model.experts.bank.heads[0].classes.tolist() == [0, 1, 2]


@pytest.mark.parametrize("build, error, message", [
    (lambda vit: RanPAC(vit, width=0), ValueError, "width must be an integer >= 1, got 0"),
    (lambda vit: RanPAC(vit, width=2.5), ValueError, "width must be an integer >= 1, got 2.5"),
    (lambda vit: RanPAC(vit, seed="0"), ValueError, "seed must be an integer, got '0'"),
    (lambda vit: RanPAC(nn.Linear(4, 4)), TypeError, "model must be a timm.models.vision_transformer.VisionTransf"),
    (lambda vit: NCM(nn.Linear(4, 4)), TypeError, "got torch.nn.modules.linear.Linear"),
    (lambda vit: NCM(vit, train_mb_size=0), ValueError, "train_mb_size must be an integer >= 1, got 0"),
    (lambda vit: NCM(vit, check_data="yes"), ValueError, "check_data must be True or False, got 'yes'"),
    (lambda vit: NCM(vit, plugins=DataChecksPlugin()), ValueError, "plugins must be a sequence"),
    (lambda vit: JointLoRA(vit), TypeError, "missing 1 required keyword-only argument: 'num_classes'"),
    (lambda vit: JointLoRA(vit, num_classes=0), ValueError, "num_classes must be an integer >= 1, got 0"),
    (lambda vit: JointLoRA(vit, num_classes=2.0), ValueError, "num_classes must be an integer >= 1, got 2.0"),
    (lambda vit: JointLoRA(vit, num_classes=4, rank=0), ValueError, "rank must be an integer >= 1, got 0"),
    (lambda vit: JointLoRA(vit, num_classes=4, lr=-1.0), ValueError, "lr must be a number > 0, got -1.0"),
    (lambda vit: JointLoRA(nn.Linear(4, 4), num_classes=4), TypeError, "model must be a timm"),
    # The options every baseline shares (BaselineOptions), refused alike by each.
    (lambda vit: RanPAC(vit, train_mb_size=0), ValueError, "train_mb_size must be an integer >= 1, got 0"),
    (lambda vit: RanPAC(vit, check_data=1), ValueError, "check_data must be True or False, got 1"),
    (lambda vit: RanPAC(vit, plugins=DataChecksPlugin()), ValueError,
     "plugins must be a sequence of Avalanche plugins or None, got <"),
    (lambda vit: NCM(vit, eval_mb_size=None), ValueError, "eval_mb_size must be an integer >= 1, got None"),
    (lambda vit: JointLoRA(vit, num_classes=4, check_data="yes"), ValueError,
     "check_data must be True or False, got 'yes'"),
    (lambda vit: JointLoRA(vit, num_classes=4, plugins=DataChecksPlugin()), ValueError, "plugins must be a sequence"),
    (lambda vit: JointLoRA(vit, num_classes=4, train_mb_size=0), ValueError,
     "train_mb_size must be an integer >= 1, got 0"),
    (lambda vit: JointLoRA(vit, num_classes=4, eval_mb_size=2.0), ValueError,
     "eval_mb_size must be an integer >= 1, got 2.0"),
    (lambda vit: JointLoRA(vit, num_classes=4, momentum=-0.5), ValueError, "momentum must be a number >= 0, got -0.5"),
    (lambda vit: JointLoRA(vit, num_classes=4, weight_decay="0"), ValueError,
     "weight_decay must be a number >= 0, got '0'"),
    (lambda vit: CurrentClassesMasking(IncrementalClassifier(32, 4, masking=False)), ValueError,
     "head must be an avalanche.models.IncrementalClassifier built with masking=True"),
])
def test_bad_arguments_are_refused_by_name(build, error, message):
    with pytest.raises(error, match=re.escape(message)):
        build(tiny_vit())


@pytest.mark.parametrize("name", BUILDERS)
def test_a_config_and_the_same_options_as_keywords_build_the_same_baseline(name):
    build, config_class = BUILDERS[name], CONFIGS[name]
    own = {"width": WIDTH} if name == "RanPAC" else {"num_classes": 4, "rank": 2} if name == "JointLoRA" else {}
    options = {**own, "train_mb_size": 16, "check_data": False}
    by_keywords = build(tiny_vit(0), evaluator=quiet_evaluator(), **options)
    by_config = build(tiny_vit(0), config=config_class(**options), evaluator=quiet_evaluator())
    # Options given beside a config replace its fields; Avalanche's keywords go on to its template.
    mixed = build(tiny_vit(0), config=config_class(**{**options, "train_mb_size": 8}), train_mb_size=16,
                  evaluator=quiet_evaluator(), eval_every=1)
    assert by_keywords.config == by_config.config == mixed.config == config_class(**options)
    assert (mixed.train_mb_size, mixed.eval_every) == (16, 1)
    assert not any(plugin.scan_experiences for plugin in mixed.plugins if isinstance(plugin, DataChecksPlugin))


def test_joint_lora_needs_num_classes_and_takes_the_runners_keywords():
    with pytest.raises(TypeError, match=r"missing 1 required keyword-only argument: 'num_classes'"):
        JointLoRA(tiny_vit())
    # The runner's call (runner/methods.py): the options as keywords, then the budget every strategy gets.
    strategy = JointLoRA(tiny_vit(), num_classes=4, rank=2, lr=0.05, momentum=0.9, weight_decay=1e-4,
                         train_mb_size=16, train_epochs=3, eval_mb_size=32, device="cpu", evaluator=quiet_evaluator())
    group = strategy.optimizer.param_groups[0]
    assert (group["lr"], group["weight_decay"], strategy.model.experts.rank) == (0.05, 1e-4, 2)
    assert (strategy.train_mb_size, strategy.train_epochs, strategy.eval_mb_size) == (16, 3, 32)
