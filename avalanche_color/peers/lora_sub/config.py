"""LoRA subtraction's options, declared and checked once (:class:`LoRASubtractionConfig`).

Defaults are the authors' Split CIFAR-100 run (scarlet0703/LoRA-Sub-DRS at 836ad29,
``configs/cifar100.json`` with ``methods/lorasub_drs.py``): rank 10, their Adam at lr 5e-4 for the
LoRA weights and 2e-3 for the head, no weight decay, the per-epoch cosine, batch 128, 20 epochs,
the subspace threshold 0.99 (hard-coded there), the triplet margin 1.0 and weight 0.05
(ImageNet-R: margin 2.0, weight 0.2, head lr 5e-4, 50 epochs, 40 in the first task).
"""

from __future__ import annotations

from typing import Literal, Optional, get_args

from avalanche_color.config import LoaderOptions, TrainingOptions
from avalanche_color.peers.lora_sum.config import SCHEDULES, Schedule
from avalanche_color.utils.checks import (fraction, integer, non_negative, one_of, option, option_group, optional,
                                          positive, positive_int)

__all__ = ["LoRASubtractionConfig", "SameClassPrototypes", "Schedule"]

SameClassPrototypes = Literal["include", "exclude"]
SAME_CLASS_PROTOTYPES: tuple[str, ...] = get_args(SameClassPrototypes)


@option_group
class LoRASubtractionConfig(TrainingOptions, LoaderOptions):
    """Every option of :class:`~avalanche_color.peers.lora_sub.strategy.LoRASubtraction`, with the authors'
    CIFAR-100 values as defaults."""

    rank: int = option(10, positive_int, expert_setting=True,
                       doc="rank of each experience's A and B, for k and for v (code: 10).")
    threshold: float = option(
        0.99, fraction,
        doc="the fraction of the summed singular values of a block's input covariance that ``P``'s directions "
            "reach (code: 0.99, hard-coded); 1.0: no projection, as the code does for 1.")
    margin: float = option(1.0, positive, doc="the triplet loss's margin (code: 1.0 on CIFAR-100, 2.0 on ImageNet-R).")
    triplet_weight: float = option(
        0.05, non_negative,
        doc="lambda, the triplet loss's weight beside the cross-entropy (code: 0.05 on CIFAR-100, 0.2 on "
            "ImageNet-R).")
    same_class_prototypes: SameClassPrototypes = option(
        "include", one_of(SAME_CLASS_PROTOTYPES),
        doc='``"include"``: every stored prototype is a negative of the triplet loss (code); ``"exclude"``: not '
            'those of the anchor\'s own class (they exist on streams where a class returns, one per experience '
            'that trained it).')
    lr: float = option(5e-4, positive, doc="learning rate of the LoRA weights (code: 5e-4).")
    head_lr: float = option(2e-3, positive,
                            doc="learning rate of the training head (code: 2e-3 on CIFAR-100, 5e-4 on ImageNet-R).")
    weight_decay: float = option(0.0, non_negative, doc="L2 weight decay of both groups (code: none).")
    lr_schedule: Schedule = option(
        "epoch_cosine", one_of(SCHEDULES),
        doc='``"epoch_cosine"``: the code\'s per-epoch cosine as it runs, one epoch late (epochs 0 and 1 at lr, '
            'epoch e >= 1 of E at ``lr cos(99 pi (e - 1) / (200 (E - 1)))``); ``"cosine"`` over each '
            'experience\'s steps to 0; or ``"constant"``.')
    train_epochs: int = option(
        20, positive_int,
        doc="epochs per experience (code: 20 on CIFAR-100), and the length of the per-epoch cosine in every "
            "experience.")
    first_experience_epochs: Optional[int] = option(
        None, optional(positive_int),
        doc="epochs of the first experience, the code's ``init_epoch`` (ImageNet-R: 40 against 50 later; "
            "CIFAR-100: 20 as later); None: ``train_epochs``. Its per-epoch cosine keeps ``train_epochs`` as its "
            "length, as the code's does, so it stops early on the curve.")
    init_seed: int = option(
        0, integer,
        doc="seed of each new component's and head rows' random initialisation, drawn apart from the global "
            "generators: a run under torchrun, a resumed run and a single process draw the same.")
