"""Issue 63, item 3: an experience whose training learns nothing is reported, for every strategy that trains.

The rule on its own (:class:`LearningCheck` on logits the test writes): the binomial margin, the loss that did not
fall, the samples of other classes left out, the first step not counted, a one-class experience not judged. Then
every method of the runner's registry that trains by gradient, on a stream where nothing can be learned (each
image shown once with each of its experience's labels, at a learning rate of 1e-9), warns naming the experience,
the accuracy, chance and the lr; trained where it learns (its test accuracy says so), it does not warn; and the
runner records what it found in each run's record and says it under the table.
"""

from __future__ import annotations

import json
import math
import re
import warnings

import pytest
import torch
from avalanche.benchmarks import tensors_benchmark
from avalanche.training import JointTraining
from avalanche.training.determinism.rng_manager import RNGManager

from avalanche_color import ExpertLearnedNothing, LearningCheckPlugin
from avalanche_color.runner import RunConfig, run_comparison
from avalanche_color.runner.methods import REGISTRY
from avalanche_color.runner.run import checked
from avalanche_color.training.learning_check import LearningCheck, learning_check
from helpers import stream_metric
from registered import build_small, build_small_with, one_method_per_strategy
from streams import class_stream

pytestmark = pytest.mark.usefixtures("one_thread")

# Every method that trains by gradient, one per strategy class (the CoLoR family trains as CoLoR), and each of
# Avalanche's strategies the runner builds itself (Naive, FT-masked, EWC, LwF, Replay, Joint-FT).
TRAINING = [name for name in one_method_per_strategy() if REGISTRY[name].lr_chosen_by] + [
    name for name, entry in REGISTRY.items() if entry.strategy is None and entry.lr_chosen_by]


# ---------------------------------------------------------------------- the rule, on logits the test writes

def logits_for(predicted: list[int], columns: int = 4) -> torch.Tensor:
    """Logits whose largest entry is at each sample's ``predicted`` class."""
    logits = torch.zeros(len(predicted), columns)
    logits[torch.arange(len(predicted)), torch.tensor(predicted)] = 5.0
    return logits


def judge(epochs: list[list[tuple[list[int], list[int]]]], classes=(2, 3), noise_sigmas: float = 2.0):
    """:meth:`LearningCheck.finish` after ``epochs``, each a list of steps ``(predicted, labels)``."""
    check = LearningCheck(noise_sigmas)
    check.start(4, classes, 0.05)
    for steps in epochs:
        check.start_epoch()
        for predicted, labels in steps:
            check.observe(logits_for(predicted), torch.tensor(labels))
        check.end_epoch()
    return check.finish()


def steps_scoring(correct: int, total: int, first: tuple[list[int], list[int]] = ([2], [2])):
    """One epoch: a first step (not counted), then ``total`` samples of classes 2 and 3 (half each), of which the
    first ``correct`` are predicted right and the others wrong."""
    labels = [2 + i % 2 for i in range(total)]
    predicted = [label if i < correct else 5 - label for i, label in enumerate(labels)]
    return [first, (predicted, labels)]


def test_an_accuracy_within_the_binomial_margin_of_chance_is_reported_and_one_above_it_is_not():
    total = 100  # margin: 2 sqrt(0.25 / 100) = 0.10 above chance 0.5
    found = judge([steps_scoring(60, total)])
    assert found is not None and found.at_chance and not found.loss_did_not_fall
    assert (found.experience, found.accuracy, found.chance, found.samples, found.lr) == (4, 0.6, 0.5, 100, 0.05)
    assert found.margin == pytest.approx(0.1)
    assert judge([steps_scoring(61, total)]) is None
    # The margin is noise_sigmas binomial standard deviations: with 1, 56% is above it.
    assert judge([steps_scoring(56, total)], noise_sigmas=1.0) is None
    assert judge([steps_scoring(55, total)], noise_sigmas=1.0) is not None


def test_chance_is_the_most_frequent_class_share_so_a_constant_prediction_is_reported():
    # 75 of 100 samples are class 2: always predicting it scores 75%, which 1/classes (50%) would call learned.
    labels = [2] * 75 + [3] * 25
    found = judge([[([2], [2]), ([2] * 100, labels)]])
    assert found is not None and (found.accuracy, found.chance) == (0.75, 0.75)


def test_a_loss_that_did_not_fall_from_the_first_epoch_to_the_last_is_reported_even_above_chance():
    check = LearningCheck()
    check.start(0, [0, 1], 0.1)
    labels = torch.tensor([0, 1] * 50)
    for scale in (2.0, 5.0, 1.0):  # right every time, surer, then less sure than at first
        check.start_epoch()
        check.observe(logits_for(labels.tolist(), columns=2) * scale / 5, labels)
        check.observe(logits_for(labels.tolist(), columns=2) * scale / 5, labels)
        check.end_epoch()
    found = check.finish()
    assert found is not None and found.loss_did_not_fall and not found.at_chance and found.accuracy == 1.0
    assert found.last_loss > found.first_loss
    assert "its loss did not fall (first epoch" in found.message("CoLoR")


def test_samples_of_other_classes_and_the_first_step_are_not_counted():
    # Replayed samples of classes 0 and 1 (all predicted wrong) leave the accuracy on classes 2 and 3 as it is;
    # the first step, all wrong too, ran the untrained weights.
    # Counted, either would bring the accuracy to 90 / 300.
    replayed = ([2] * 200, [0] * 100 + [1] * 100)
    first = ([3, 2] * 100, [2, 3] * 100)
    assert judge([[first, *steps_scoring(90, 100)[1:], replayed]]) is None
    assert judge([[first, *steps_scoring(90, 100)[1:], ([3, 2] * 100, [2, 3] * 100)]]) is not None
    assert judge([[([2], [2]), *steps_scoring(90, 100)[1:], ([2] * 200, [3] * 200)]]) is not None
    assert judge([[first]]) is None  # one step: nothing counted, nothing judged


def test_an_experience_of_one_class_or_outputs_without_its_columns_are_not_judged():
    assert judge([steps_scoring(0, 10)], classes=(2,)) is None  # one class: nothing to tell apart
    check = LearningCheck()
    check.start(0, [5, 6], 0.05)
    check.start_epoch()
    for _ in range(3):
        check.observe(logits_for([0, 1]), torch.tensor([5, 6]))  # 4 columns cannot hold classes 5 and 6
    check.end_epoch()
    assert check.finish() is None


def test_epochs_without_steps_judge_nothing():
    # A training-free strategy (NCM, RanPAC) runs its epochs' callbacks without a step.
    check = LearningCheck()
    check.start(0, [0, 1], None)
    for _ in range(2):
        check.start_epoch()
        check.end_epoch()
    assert check.finish() is None


def test_noise_sigmas_is_checked():
    with pytest.raises(ValueError, match=r"noise_sigmas must be a finite number >= 0, got -1"):
        LearningCheckPlugin(noise_sigmas=-1)


# ---------------------------------------------------------------------- every strategy that trains

def nothing_to_learn(num_experiences: int = 2, per_class: int = 20, joint: bool = False):
    """``class_stream``'s images, each shown once with each label of its experience (``joint``: of the stream): no
    function of the image can score better than chance (1/2; joint, 1/4) on it."""
    stream = class_stream(num_experiences, per_class=per_class)
    train = []
    for experience in stream.train_stream:
        images = torch.stack([experience.dataset[i][0] for i in range(len(experience.dataset))])
        classes = (list(range(2 * num_experiences)) if joint else sorted(experience.classes_in_this_experience))
        train.append((images.repeat(len(classes), 1, 1, 1),
                      torch.tensor(classes).repeat_interleave(len(images))))
    test = [(torch.stack([e.dataset[i][0] for i in range(len(e.dataset))]),
             torch.tensor([int(e.dataset[i][1]) for i in range(len(e.dataset))])) for e in stream.test_stream]
    return tensors_benchmark(train, test, task_labels=[0] * num_experiences)


def build(name: str, lr: float | None = None, options: dict | None = None, **settings):
    """The runner's strategy for ``name`` on the tiny ViT, at learning rate ``lr`` (None: the method's own), with the
    learning check the runner gives it."""
    entry, options = REGISTRY[name], dict(options or {})
    if entry.strategy is None:  # Avalanche's strategies, built with --baseline-lr
        strategy = build_small(name, **({} if lr is None else {"baseline_lr": lr}), **settings)
    else:
        strategy = build_small_with(name, options={**options, **({} if lr is None else {"lr": lr})}, **settings)
    checked(strategy)
    return strategy


def train(strategy, benchmark, experiences=None) -> None:
    """Train on the stream (its first ``experiences``), at once for a joint training."""
    stream = benchmark.train_stream if experiences is None else benchmark.train_stream[:experiences]
    if isinstance(strategy, JointTraining):
        strategy.train(stream)
    else:
        for experience in stream:
            strategy.train(experience)


@pytest.mark.parametrize("name", TRAINING)
def test_every_strategy_warns_where_nothing_can_be_learned_naming_experience_accuracy_chance_and_lr(name):
    RNGManager.set_random_seeds(0)
    strategy = build(name, lr=1e-9, epochs=2)
    assert learning_check(strategy) is not None  # the package's strategies have their own; the runner adds one
    with pytest.warns(ExpertLearnedNothing) as caught:
        train(strategy, nothing_to_learn(joint=REGISTRY[name].joint))
    joint = REGISTRY[name].joint
    experiences = [0] if joint else [0, 1]
    messages = [str(w.message) for w in caught if w.category is ExpertLearnedNothing]
    assert len(messages) == len(experiences), messages
    chance = "25.0%" if joint else "50.0%"  # a joint training's one experience holds every class
    for experience, message in zip(experiences, messages):
        assert re.fullmatch(rf"{type(strategy).__name__}, experience {experience}: learned nothing: training "
                            rf"accuracy \d+\.\d% on its \d classes over the last epoch \(\d+ samples\) is no better "
                            rf"than chance \({chance}, noise margin \d+\.\d%\).*; lr 1e-09\. Try another .*", message)
    findings = learning_check(strategy).findings
    assert [f.experience for f in findings] == experiences and all(f.lr == 1e-9 and f.at_chance for f in findings)


# Where each method learns the first experience of class_stream (its test accuracy is well above chance): more
# epochs than the shared tests' one, and for L2P the settings of its own tests (tests/test_l2p.py), on its pooled
# [CLS] feature (a random tiny ViT's prompt outputs carry little of the image).
LEARNS = dict(epochs=8, batch_size=16)
LEARNS_WITH = {"L2P": dict(lr=0.003, prompt_length=2, top_n=3, head_input="pooled"), "Naive": 0.05, "FT-masked": 0.05, "EWC": 0.05,
               "LwF": 0.05, "Replay": 0.05, "Joint-FT": 0.05}


@pytest.mark.parametrize("name", TRAINING)
def test_a_strategy_that_learns_does_not_warn(name):
    RNGManager.set_random_seeds(0)
    own = LEARNS_WITH.get(name)
    strategy = (build(name, lr=own, **LEARNS) if isinstance(own, float)
                else build(name, options=own, **LEARNS))
    benchmark = class_stream(2, per_class=40)
    joint = REGISTRY[name].joint
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExpertLearnedNothing)
        train(strategy, benchmark, experiences=None if joint else 1)
    tested = benchmark.test_stream if joint else benchmark.test_stream[:1]
    chance = 0.25 if joint else 0.5
    assert stream_metric(strategy.eval(tested), "Top1_Acc") > chance + 0.2  # it did learn
    assert learning_check(strategy).findings == []


def test_the_check_can_be_removed_or_silenced():
    strategy = build("CoLoR", lr=1e-9, epochs=2)
    strategy.plugins.remove(learning_check(strategy))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExpertLearnedNothing)
        train(strategy, nothing_to_learn(), experiences=1)
    assert learning_check(strategy) is None


# ---------------------------------------------------------------------- the runner's record

def test_the_runner_records_what_learned_nothing_and_says_it_under_the_table(tiny_backbone, tmp_path):
    config = RunConfig(benchmark="digits_class", methods=("CoLoR",), epochs=2, batch_size=64,
                       backbone=tiny_backbone, out=tmp_path / "stuck", ranks=(2,), color_lr=1e-9)
    with pytest.warns(ExpertLearnedNothing, match=r"CoLoR, experience 0: learned nothing: .*lr 1e-09"):
        result = run_comparison(config, progress=False)
    [run] = result["runs"]
    assert [finding["experience"] for finding in run["learned_nothing"]] == list(range(5))
    for finding in run["learned_nothing"]:
        assert finding["lr"] == 1e-9 and finding["chance"] == pytest.approx(0.5, abs=0.05)
        assert finding["accuracy"] <= finding["chance"] + finding["margin"]
        assert math.isfinite(finding["first_loss"]) and math.isfinite(finding["last_loss"])
    saved = json.loads((tmp_path / "stuck" / "results.json").read_text())
    assert saved["runs"][0]["learned_nothing"] == run["learned_nothing"]
    note = "Learned nothing (training accuracy no better than chance, or the loss did not fall"
    assert note in result["table"] and "CoLoR seed 0 (experiences 0, 1, 2, 3, 4, lr 1e-09)" in result["table"]
    assert note in (tmp_path / "stuck" / "summary.md").read_text()

    # At a learning rate and budget that suit it, the same stream is learned (each expert's test accuracy, routed
    # by task label, is well above chance just after it trained): nothing recorded, nothing said.
    learned = RunConfig(benchmark="digits_class", methods=("CoLoR-oracle",), epochs=8, batch_size=16,
                        backbone=tiny_backbone, out=tmp_path / "learned", ranks=(2,), color_lr=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExpertLearnedNothing)
        result = run_comparison(learned, progress=False)
    [run] = result["runs"]
    assert run["learned_nothing"] == [] and "Learned nothing" not in result["table"]
    assert min(run["accuracy_matrix"][i][i] for i in range(5)) > 0.6  # chance: 0.5
