"""SD-LoRA's own mechanics: frozen directions, learning magnitudes (tiny ViTs, CPU, seconds; what it shares
with InfLoRA: test_lora_sum.py)."""

from __future__ import annotations

import pytest
import torch

from avalanche_color import SDLoRA
from avalanche_color.peers.lora_sum.layer import direction_norm
from lora_sum_cases import tiny, trained_counts
from streams import class_stream

pytestmark = pytest.mark.usefixtures("one_thread")


def test_earlier_directions_stay_bit_identical_while_their_magnitudes_learn():
    strategy = tiny(SDLoRA)
    stream = class_stream(num_experiences=3, per_class=8).train_stream
    strategy.train(stream[0])
    first = {k: v.clone() for k, v in strategy.model.state_dict().items() if ".components.0." in k}
    magnitudes = [float(strategy.model.magnitudes[0].detach())]
    for experience in stream[1:]:
        strategy.train(experience)
        magnitudes.append(float(strategy.model.magnitudes[0].detach()))
        for key, value in first.items():
            assert torch.equal(strategy.model.state_dict()[key], value), key
    assert len(set(magnitudes)) == 3  # alpha_1 changed in each later experience
    assert strategy.model.finished.tolist() == [True, True, True]


def test_a_finished_direction_is_normalised_and_scaled_by_its_magnitude():
    strategy = tiny(SDLoRA)
    stream = class_stream(num_experiences=2, per_class=8).train_stream
    strategy.train(stream[0])
    layer = strategy.model.layers[0]
    mixing = strategy.model.mixing()
    delta = layer.delta_weight(0, mixing)  # alpha_1 B A / ||B A||_F for q and v
    alpha = strategy.model.magnitudes[0].detach()
    torch.testing.assert_close(torch.linalg.matrix_norm(delta), alpha.expand(2))
    component = layer.components[0]
    torch.testing.assert_close(direction_norm(component.A[0], component.B[0], "product"),
                               torch.linalg.matrix_norm(component.B[0] @ component.A[0]))


def test_trainable_parameters_per_experience_equal_the_formula():
    # Experience t (0-based), depth L, width d, rank r_t, classes seen C_t:
    # A and B of q and v in every block, 2 L r_t (d + d); t + 1 magnitudes; the head (d + 1) C_t.
    depth, d, classes = 2, 32, 2
    counts = trained_counts(SDLoRA, rank_schedule=(3, 2))
    ranks = [3, 2, 2]
    assert counts == [2 * depth * r * (d + d) + (t + 1) + (d + 1) * classes * (t + 1) for t, r in enumerate(ranks)]


def test_what_trains_is_declared_not_read_back_from_requires_grad():
    # A user's model.requires_grad_(True) changes neither the computation nor what the optimiser gets.
    strategy = tiny(SDLoRA)
    stream = class_stream(num_experiences=2, per_class=8).train_stream
    for experience in stream:
        strategy.train(experience)
    model = strategy.model.eval()
    x = torch.stack([stream[1].dataset[i][0] for i in range(4)])
    declared = [id(p) for p in model.trainable_parameters()]
    before = model(x)
    model.requires_grad_(True)
    assert torch.equal(model(x), before)
    assert [id(p) for p in model.trainable_parameters()] == declared


def test_a_direction_finished_before_it_learned_adds_nothing_instead_of_nan():
    # EarlyStoppingPlugin may restore an experience's first state (B = 0) and stop: the finished
    # direction B A / ||B A|| is then 0 / 0; it must add nothing, not turn every logit into NaN.
    strategy = tiny(SDLoRA)
    stream = class_stream(num_experiences=2, per_class=8)
    strategy.train(stream.train_stream[0])
    model = strategy.model.eval()
    x = torch.stack([stream.test_stream[0].dataset[i][0] for i in range(4)])
    before = model(x)
    model.learn_classes([2, 3])  # a second component, B = 0, finished without any training
    model.finish_component()
    after = model(x)
    assert torch.isfinite(after[:, :2]).all()
    torch.testing.assert_close(after[:, :2], before[:, :2])  # the unlearned direction changes nothing
