"""LoRA subtraction under torchrun: 2 CPU processes (gloo) against one process on the same data, as SD-LoRA's
and InfLoRA's (lora_sum_torchrun.py): one full-experience batch per step; the covariance pass before experience
2 and the prototypes after each experience run over the experience's whole data on every rank, and DDP averages
the gradients the projected Adam steps on."""

from __future__ import annotations

import pytest

from avalanche_color import LoRASubtraction
from lora_sum_torchrun import check_two_ranks_equal_one_process

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow
def test_without_the_triplet_loss_two_processes_equal_one_process(tmp_path):
    # The covariance pass, the projection, the projected Adam over DDP's mean gradient and the prototypes.
    check_two_ranks_equal_one_process(LoRASubtraction, tmp_path, triplet_weight=0.0)


@pytest.mark.slow
@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "the triplet loss takes each anchor's hardest positive and negative within the batch it is given: each rank's "
    "half, not the whole batch, so DDP's mean of the ranks' gradients is not the one process's (already in the "
    "first experience's A); the strategy's criterion would need the features and labels of every rank "
    "(a differentiable all_gather) as the candidates"))
def test_two_processes_under_torchrun_equal_one_process(tmp_path):
    check_two_ranks_equal_one_process(LoRASubtraction, tmp_path)
