"""S-Prompts' learning-rate schedules: CoLoR's cosine per step, and its code's cosine per epoch."""

import math

import pytest
import torch

from avalanche_color import SPrompts
from helpers import LearningRates, quiet_evaluator
from streams import class_stream, tiny_vit


def trained_rates(epochs: int, **options) -> LearningRates:
    rates = LearningRates()
    strategy = SPrompts(tiny_vit(), evaluator=quiet_evaluator(), prompt_length=2, k=2, lr=0.01,
                        train_epochs=epochs, train_mb_size=16, plugins=[rates], **options)
    for experience in class_stream(num_experiences=2, per_class=20).train_stream:  # 40 samples: 3 batches
        strategy.train(experience)
    return rates


def test_the_codes_epoch_cosine_holds_each_epochs_rate_as_the_code_steps_it():
    # methods/sprompt.py: SGD and CosineAnnealingLR(T_max=epochs) made per task, scheduler.step() after each
    # epoch's batches; eta_min 0. Epoch e of E runs at lr (1 + cos(pi e / E)) / 2, from lr, never reaching 0.
    epochs = 4
    rates = trained_rates(epochs, lr_schedule="epoch_cosine")
    expected = [0.01 * (1 + math.cos(math.pi * e / epochs)) / 2 for e in range(epochs)]
    # The code's loop, run: torch's scheduler stepped once per epoch.
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.01, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer=optimizer, T_max=epochs)
    code = []
    for _ in range(epochs):
        code.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert code == pytest.approx(expected, rel=1e-12)
    for experience in range(2):  # restarted with each experience's optimiser
        for epoch in range(epochs):
            seen = rates.seen[(experience, epoch)]
            assert seen == pytest.approx([expected[epoch]] * 3, rel=1e-12)
    assert expected[0] == 0.01 and expected[-1] / 0.01 == pytest.approx(0.1464, abs=1e-4)


def test_the_default_cosine_anneals_every_step_towards_zero():
    epochs = 2
    rates = trained_rates(epochs)
    steps = 3 * epochs
    expected = [0.01 * (1 + math.cos(math.pi * s / steps)) / 2 for s in range(steps)]
    for experience in range(2):
        seen = [rate for epoch in range(epochs) for rate in rates.seen[(experience, epoch)]]
        assert seen == pytest.approx(expected, rel=1e-9)


def test_an_unknown_schedule_is_refused_naming_the_allowed_ones():
    with pytest.raises(ValueError, match=r"lr_schedule must be one of .*'cosine', 'epoch_cosine'.*got 'step'"):
        SPrompts(tiny_vit(), lr_schedule="step", evaluator=quiet_evaluator())
