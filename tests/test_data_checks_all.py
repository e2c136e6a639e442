"""Issue 39, points 1 and 2: one data check for every strategy, before any state changes.

Each strategy that learns experience by experience (from the runner's registry) learns a first
experience, is then offered a bad second one (a NaN pixel, no samples, float labels, a negative
label), and must refuse it by name with its whole state exactly as before; a loss that turns NaN stops each of them naming the
experience and the iteration; class ids far above the classes seen are accepted with a warning.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from avalanche.benchmarks import tensors_benchmark

from avalanche_color import L2P, InfLoRA, LoRAExpertsPlugin, PrototypeRouterPlugin, SPrompts
from avalanche_color.runner.methods import REGISTRY
from helpers import quiet_evaluator
from registered import build_small, one_method_per_strategy
from streams import IMAGE_SIZE, class_stream, tiny_vit

pytestmark = pytest.mark.usefixtures("one_thread")

# Every strategy of the package that learns experience by experience, one method per class, from the runner's
# registry (registered.py); Joint-LoRA trains once, on the whole stream.
STRATEGIES = {name: (lambda name=name: build_small(name, num_classes=10)) for name in one_method_per_strategy()
              if not REGISTRY[name].joint}
TRAINED_BY_GRADIENT = [name for name in STRATEGIES if REGISTRY[name].lr_chosen_by]  # not NCM, RanPAC: no loss


def learned(name):
    strategy = STRATEGIES[name]()
    strategy.train(class_stream(num_experiences=1, per_class=6).train_stream[0])
    return strategy, state(strategy)


def state(strategy) -> dict:
    return {k: v.detach().clone() for k, v in strategy.model.state_dict().items()}


def unchanged(strategy, before) -> bool:
    after = state(strategy)
    return after.keys() == before.keys() and all(
        after[k].shape == before[k].shape and torch.equal(after[k], before[k]) for k in before)


def second_experience(images, labels):
    first = (torch.zeros(2, 3, IMAGE_SIZE, IMAGE_SIZE), torch.tensor([0, 1]))
    return tensors_benchmark([first, (images, labels)], [first, first], task_labels=[0, 0]).train_stream[1]


def images(count: int = 8) -> torch.Tensor:
    return torch.randn(count, 3, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(1))


def nan_pixel():
    bad = images()
    bad[5, 1, 2, 3] = float("nan")
    return second_experience(bad, torch.tensor([2, 3] * 4))


BAD = {
    "nan pixel": (nan_pixel, r"experience 1, sample 5: images must have finite pixels, got 1 NaN"),
    "empty": (lambda: second_experience(torch.empty(0, 3, IMAGE_SIZE, IMAGE_SIZE), torch.empty(0, dtype=torch.long)),
              r"experience 1 has no training samples"),
    "float labels": (lambda: second_experience(images(), torch.tensor([2.0, 3.5] * 4)),
                     r"experience 1, sample 0: labels must be integer class ids .*got 2\.0 of dtype torch\.float32"),
    "negative label": (lambda: second_experience(images(), torch.tensor([2, -1] * 4)),
                       r"class ids must be >= 0"),
}


@pytest.mark.parametrize("case", BAD)
@pytest.mark.parametrize("name", STRATEGIES)
def test_every_strategy_refuses_bad_data_before_its_state_changes(name, case):
    strategy, before = learned(name)
    make, message = BAD[case]
    with pytest.raises(ValueError, match=message):
        strategy.train(make())
    assert unchanged(strategy, before)


class NaNFrom(torch.nn.Module):
    """Cross-entropy that turns NaN from the ``start``-th call on (as a diverging run's loss does)."""

    def __init__(self, start: int) -> None:
        super().__init__()
        self.start, self.calls = start, 0

    def forward(self, logits, labels):
        self.calls += 1
        loss = torch.nn.functional.cross_entropy(logits, labels)
        return loss * float("nan") if self.calls > self.start else loss


@pytest.mark.parametrize("name", TRAINED_BY_GRADIENT)
def test_a_non_finite_loss_stops_every_strategy_naming_experience_and_iteration(name):
    strategy = STRATEGIES[name]()
    strategy._criterion = NaNFrom(start=1)  # the stream's first experience: 12 samples, batches of 8
    with pytest.raises(FloatingPointError, match=r"the training loss became \[nan\] at experience 0, epoch 0, "
                                                 r"iteration 1; stopped before the backward pass"):
        strategy.train(class_stream(num_experiences=1, per_class=6).train_stream[0])


def test_inf_lora_stops_on_inputs_that_overflow_before_designing_its_branch():
    strategy, _ = learned("InfLoRA")
    huge = images().sign() * 3e38  # finite pixels, but the patch embedding overflows
    with pytest.raises(FloatingPointError, match=r"became non-finite over experience 1's training data, while "
                                                 r"designing its A_t"):
        strategy.train(second_experience(huge, torch.tensor([2, 3] * 4)))


@pytest.mark.parametrize("name", STRATEGIES)
def test_non_finite_pixels_at_evaluation_are_refused_by_every_strategy(name):
    strategy, _ = learned(name)
    bad = images(4)
    bad[2, 0, 0, 0] = float("nan")
    stream = tensors_benchmark([(bad, torch.tensor([0, 1, 0, 1]))], [(bad, torch.tensor([0, 1, 0, 1]))],
                               task_labels=[0]).test_stream
    with pytest.raises(ValueError, match=r"evaluation on experience 0: images must have finite pixels"):
        strategy.eval(stream)


def test_the_drop_in_plugins_run_the_same_check():
    from avalanche.training import Naive

    strategy = Naive(model=tiny_vit(0), optimizer=torch.optim.SGD(tiny_vit(0).parameters(), lr=0.01),
                     train_mb_size=8, train_epochs=1, evaluator=quiet_evaluator(),
                     plugins=[LoRAExpertsPlugin(rank=2), PrototypeRouterPlugin(k=2)])
    with pytest.raises(ValueError, match=r"experience 1, sample 5: images must have finite pixels"):
        strategy.train(nan_pixel())
    assert not hasattr(strategy.model, "num_experts") or strategy.model.num_experts == 0


@pytest.mark.parametrize("name", STRATEGIES)
def test_class_ids_far_above_the_classes_seen_are_accepted_with_a_warning(name):
    strategy, _ = learned(name)
    with pytest.warns(UserWarning, match=r"experience 1 has class ids up to 100000, but only 4 distinct classes "
                                         r"have been seen.*map them to 0\.\.3"):
        strategy.train(second_experience(images(), torch.tensor([2, 100000] * 4)))


def test_class_ids_close_to_the_classes_seen_give_no_warning():
    strategy, _ = learned("L2P")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        strategy.train(second_experience(images(), torch.tensor([2, 3] * 4)))


@pytest.mark.parametrize("make", [lambda: SPrompts(tiny_vit(0), prompt_length=0),
                                  lambda: __import__("avalanche_color").PromptExpertViT(tiny_vit(0), prompt_length=0)],
                         ids=["SPrompts", "PromptExpertViT"])
def test_s_prompts_without_prompt_tokens_is_refused(make):
    with pytest.raises(ValueError, match=r"prompt_length must be an integer >= 1, got 0"):
        make()
