"""LoRA subtraction under torchrun: 2 CPU processes (gloo) against one process on the same data, as SD-LoRA's
and InfLoRA's (lora_sum_torchrun.py): one full-experience batch per step; the covariance pass before experience
2 and the prototypes after each experience run over the experience's whole data on every rank, the triplet loss
searches the features of every rank (gathered), and DDP averages the gradients the projected Adam steps on.
The 2 ranks: the cases LoRASubtraction, LoRASubtraction-no-triplet and gathered-triplet of lora_sum_torchrun.py's
one torchrun launch."""

from __future__ import annotations

import pytest
import torch

from avalanche_color import LoRASubtraction
from lora_sum_torchrun import GATHERED_TRIPLET, TRIPLET_ROWS, check_two_ranks_equal_one_process, triplet_case, \
    two_rank_outputs

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow
def test_without_the_triplet_loss_two_processes_equal_one_process(tmp_path_factory):
    # The covariance pass, the projection, the projected Adam over DDP's mean gradient and the prototypes.
    check_two_ranks_equal_one_process(LoRASubtraction, tmp_path_factory, triplet_weight=0.0)


@pytest.mark.slow
def test_two_processes_under_torchrun_equal_one_process(tmp_path_factory):
    # The triplet loss over the gathered batch, its gradient through the gather's backward.
    check_two_ranks_equal_one_process(LoRASubtraction, tmp_path_factory)


@pytest.mark.slow
def test_triplet_loss_over_unequal_gathered_batches_is_the_one_process_loss(tmp_path_factory):
    # Rank 0's rows padded to rank 1's count (TRIPLET_ROWS, 3 and 5; the 2 ranks of the torchrun launch,
    # lora_sum_distributed_run.py): the padding is neither anchor nor candidate, and each rank's
    # rows get W times the one-process gradient (the gather's backward sums the W equal losses'), which
    # DDP's mean over the ranks brings back to 1x.
    from avalanche_color.peers.lora_sub.strategy import augmented_triplet_loss

    outputs = two_rank_outputs(tmp_path_factory) / GATHERED_TRIPLET
    features, labels, prototypes, classes = triplet_case()
    features.requires_grad_()
    expected = augmented_triplet_loss(features / features.norm(dim=1, keepdim=True), labels, prototypes, classes,
                                      margin=1.0)
    expected.backward()
    ranks = [torch.load(outputs / f"rank{rank}.pt") for rank in range(len(TRIPLET_ROWS))]
    assert torch.equal(ranks[0]["real"], torch.tensor([True] * 3 + [False] * 2 + [True] * 5))
    for rank, result in enumerate(ranks):
        torch.testing.assert_close(result["loss"], expected.detach())
        start = sum(TRIPLET_ROWS[:rank])
        torch.testing.assert_close(result["grad"], len(TRIPLET_ROWS) * features.grad[start: start + TRIPLET_ROWS[rank]])
