"""LoRA subtraction under torchrun: 2 CPU processes (gloo) against one process on the same data, as SD-LoRA's
and InfLoRA's (lora_sum_torchrun.py): one full-experience batch per step; the covariance pass before experience
2 and the prototypes after each experience run over the experience's whole data on every rank, the triplet loss
searches the features of every rank (gathered), and DDP averages the gradients the projected Adam steps on."""

from __future__ import annotations

import pytest
import torch

from avalanche_color import LoRASubtraction
from lora_sum_torchrun import check_two_ranks_equal_one_process

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow
def test_without_the_triplet_loss_two_processes_equal_one_process(tmp_path):
    # The covariance pass, the projection, the projected Adam over DDP's mean gradient and the prototypes.
    check_two_ranks_equal_one_process(LoRASubtraction, tmp_path, triplet_weight=0.0)


@pytest.mark.slow
def test_two_processes_under_torchrun_equal_one_process(tmp_path):
    # The triplet loss over the gathered batch, its gradient through the gather's backward.
    check_two_ranks_equal_one_process(LoRASubtraction, tmp_path)


ROWS = (3, 5)  # each rank's batch: unequal, so the gather pads rank 0's


def _gathered_triplet_rank(rank: int, port: int, out: str) -> None:
    import os

    import torch

    from avalanche_color.peers.lora_sub.strategy import augmented_triplet_loss
    from avalanche_color.training.distributed import init_distributed
    from avalanche_color.training.distributed import gather_padded_rows

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(len(ROWS)))
    init_distributed(0, backend="gloo")
    features, labels, prototypes, classes = _triplet_case()
    start = sum(ROWS[:rank])
    mine = features[start: start + ROWS[rank]].clone().requires_grad_()
    gathered, real = gather_padded_rows(mine / mine.norm(dim=1, keepdim=True), max(ROWS))
    all_labels, _ = gather_padded_rows(labels[start: start + ROWS[rank]], max(ROWS))
    loss = augmented_triplet_loss(gathered, all_labels, prototypes, classes, margin=1.0, real=real)
    loss.backward()
    torch.save({"loss": loss.detach(), "grad": mine.grad, "real": real}, f"{out}/rank{rank}.pt")
    torch.distributed.destroy_process_group()


def _triplet_case():
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(sum(ROWS), 6, generator=generator, dtype=torch.float64)
    labels = torch.tensor([0, 1, 0, 2, 1, 1, 0, 2])
    prototypes = torch.randn(2, 6, generator=generator, dtype=torch.float64)
    return features, labels, prototypes, torch.tensor([0, 3])


@pytest.mark.slow
def test_triplet_loss_over_unequal_gathered_batches_is_the_one_process_loss(tmp_path):
    # Rank 0's rows padded to rank 1's count: the padding is neither anchor nor candidate, and each rank's
    # rows get W times the one-process gradient (the gather's backward sums the W equal losses'), which
    # DDP's mean over the ranks brings back to 1x.
    import socket

    import torch.multiprocessing

    from avalanche_color.peers.lora_sub.strategy import augmented_triplet_loss

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    torch.multiprocessing.spawn(_gathered_triplet_rank, args=(port, str(tmp_path)), nprocs=len(ROWS))
    features, labels, prototypes, classes = _triplet_case()
    features.requires_grad_()
    expected = augmented_triplet_loss(features / features.norm(dim=1, keepdim=True), labels, prototypes, classes,
                                      margin=1.0)
    expected.backward()
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(len(ROWS))]
    assert torch.equal(ranks[0]["real"], torch.tensor([True] * 3 + [False] * 2 + [True] * 5))
    for rank, result in enumerate(ranks):
        torch.testing.assert_close(result["loss"], expected.detach())
        start = sum(ROWS[:rank])
        torch.testing.assert_close(result["grad"], len(ROWS) * features.grad[start: start + ROWS[rank]])
