"""Bad data: a clear error (or the documented handling), and nothing already learned changes.

Each test trains a first experience, then offers a bad second one (or a bad
evaluation batch) and checks the message and that the first expert, its head
and its prototypes are exactly as before.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from avalanche.benchmarks import tensors_benchmark

from avalanche_color.training.data_checks import check_training_experience
from avalanche_color.utils.rng import generators_untouched
from avalanche_color import SPrompts
from helpers import quiet_evaluator, tiny_color
from streams import IMAGE_SIZE, class_stream, tiny_vit


pytestmark = pytest.mark.usefixtures("one_thread")


def learned(**options):
    """A strategy that has learned one experience, and a copy of its learned state."""
    strategy = tiny_color(train_epochs=2, k=2, **options)
    strategy.train(class_stream(num_experiences=1, per_class=10).train_stream[0])
    return strategy, {k: v.clone() for k, v in strategy.model.experts_state_dict().items()}


def first_expert_unchanged(strategy, before) -> bool:
    """Expert 0 (LoRA, head, class map) and every prototype are exactly as in ``before``."""
    after = strategy.model.experts_state_dict()
    kept = [k for k in before if ".experts.0." in k or k.startswith(("heads.0.", "router."))]
    return len(kept) > 3 and all(torch.equal(after[k], before[k]) for k in kept)


def second_experience(images: torch.Tensor, labels: torch.Tensor):
    """A stream whose second training experience is (images, labels); the first is unused."""
    first = (torch.zeros(2, 3, IMAGE_SIZE, IMAGE_SIZE), torch.tensor([0, 1]))
    return tensors_benchmark([first, (images, labels)], [first, first], task_labels=[0, 0]).train_stream[1]


def good_images(count: int = 8) -> torch.Tensor:
    return torch.randn(count, 3, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(1))


def test_an_empty_experience_is_refused_before_anything_changes():
    strategy, before = learned()
    experience = second_experience(torch.empty(0, 3, IMAGE_SIZE, IMAGE_SIZE), torch.empty(0, dtype=torch.long))
    with pytest.raises(ValueError, match="experience 1 has no training samples"):
        strategy.train(experience)
    assert strategy.model.num_experts == 1 and first_expert_unchanged(strategy, before)


def test_a_label_outside_the_declared_classes_is_refused():
    strategy, before = learned()
    labels = torch.tensor([2, 3] * 4)
    experience = second_experience(good_images(), labels)
    labels[5] = 7  # the samples now disagree with the classes the stream declared ([2, 3])
    with pytest.raises(ValueError, match=r"experience 1, sample 5: label must be one of the experience's "
                                         r"declared classes \[2, 3\], got 7"):
        strategy.train(experience)
    assert strategy.model.num_experts == 1 and first_expert_unchanged(strategy, before)


def test_a_negative_class_is_refused():
    strategy, before = learned()
    experience = second_experience(good_images(), torch.tensor([2, -1] * 4))
    with pytest.raises(ValueError, match=r"experience 1 declares classes \[-1, 2\]; class ids must be >= 0"):
        strategy.train(experience)
    assert strategy.model.num_experts == 1 and first_expert_unchanged(strategy, before)


@pytest.mark.parametrize("shape, got", [((3, 32, 32), r"\(1, 3, 32, 32\)"), ((1, 16, 16), r"\(1, 1, 16, 16\)")],
                         ids=["wrong size", "wrong channels"])
def test_images_of_the_wrong_size_or_channel_count_are_refused(shape, got):
    strategy, before = learned()
    experience = second_experience(torch.zeros(4, *shape), torch.tensor([2, 3, 2, 3]))
    with pytest.raises(ValueError, match=rf"experience 1, sample 0: images must have shape \(batch, 3, 16, 16\), "
                                         rf"got {got}"):
        strategy.train(experience)
    assert strategy.model.num_experts == 1 and first_expert_unchanged(strategy, before)


def test_s_prompts_refuses_bad_data_as_colors_template_does():
    strategy = SPrompts(tiny_vit(0), prompt_length=2, k=2, train_epochs=1, train_mb_size=8,
                        evaluator=quiet_evaluator())
    strategy.train(class_stream(num_experiences=1, per_class=10).train_stream[0])
    before = {k: v.clone() for k, v in strategy.model.experts_state_dict().items()}
    images = good_images()
    images[6, 2, 3, 4] = float("nan")
    with pytest.raises(ValueError, match=r"experience 1, sample 6: images must have finite pixels"):
        strategy.train(second_experience(images, torch.tensor([2, 3] * 4)))
    after = strategy.model.experts_state_dict()
    assert strategy.model.num_experts == 1 and after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)


@pytest.mark.parametrize("value, counts", [(float("nan"), "1 NaN and 0 infinite"), (float("inf"), "0 NaN and 1 infinite")],
                         ids=["nan", "inf"])
def test_non_finite_pixels_are_refused(value, counts):
    strategy, before = learned()
    images = good_images()
    images[6, 2, 3, 4] = value
    with pytest.raises(ValueError, match=rf"experience 1, sample 6: images must have finite pixels, got {counts}"):
        strategy.train(second_experience(images, torch.tensor([2, 3] * 4)))
    assert strategy.model.num_experts == 1 and first_expert_unchanged(strategy, before)


def test_a_loss_that_turns_nan_stops_training_before_any_weight_takes_it():
    strategy, before = learned()
    # Finite pixels so large that the patch embedding overflows: the loss is NaN at once.
    images = good_images().sign() * 3e38
    with pytest.raises(FloatingPointError, match=r"the training loss became \[nan\] at experience 1, epoch 0, "
                                                 r"iteration 0; stopped before the backward pass"):
        strategy.train(second_experience(images, torch.tensor([2, 3] * 4)))
    assert first_expert_unchanged(strategy, before)
    # Documented: the failing experience's expert exists, unfinished, with finite weights and no prototypes.
    assert strategy.model.num_experts == 2
    assert all(torch.isfinite(p).all() for p in strategy.model.expert_parameters(1))
    assert 1 not in strategy.model.router.owners.tolist()


def test_non_finite_pixels_in_evaluation_are_refused():
    strategy, before = learned()
    images = good_images(4)
    images[2, 0, 0, 0] = float("nan")
    stream = tensors_benchmark([(images, torch.tensor([0, 1, 0, 1]))], [(images, torch.tensor([0, 1, 0, 1]))],
                               task_labels=[0]).test_stream
    with pytest.raises(ValueError, match=r"evaluation on experience 0: images must have finite pixels, "
                                         r"got 1 NaN and 0 infinite values in batch rows \[2\]"):
        strategy.eval(stream)
    assert first_expert_unchanged(strategy, before)


def test_the_scan_leaves_the_random_generators_as_they_were():
    # The scan runs the training transforms, which may draw random numbers (augmentations).
    states = lambda: (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())  # noqa: E731
    before = states()
    with generators_untouched():
        torch.rand(3), random.random(), np.random.rand()
    after = states()
    assert torch.equal(after[0], before[0]) and after[1] == before[1] and (after[2] == before[2]).all()
    experience = class_stream(num_experiences=1, per_class=10).train_stream[0]
    vit = tiny_vit()
    before = states()
    check_training_experience(experience, vit, batch_size=4)
    assert torch.equal(states()[0], before[0])
