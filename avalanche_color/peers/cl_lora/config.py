"""CL-LoRA's options, declared and checked once (:class:`CLLoRAConfig`).

Defaults are the authors' Split CIFAR-100 run (JiangpengHe/CL-LoRA at df4e74e, ``exps/cifar.json`` with
``models/cllora.py``): rank 8 (``ffn_num``), SGD with momentum 0.9 at lr 0.03 and weight decay 1e-4,
batch 64, 30 epochs, ``CosineAnnealingLR`` to 0 stepped per epoch; the distillation weight 5 and
temperature 2 and the orthogonality weight 1e-4 are written in ``_init_train``. The first half of
the blocks hold the task-shared adapters (``general_pos``), the rest the task-specific ones.
"""

from __future__ import annotations

from typing import Literal, Optional

from avalanche_color.config import LoaderOptions, TrainingOptions
from avalanche_color.utils.checks import (integer, non_negative, non_negative_int, one_of, option, option_group,
                                          optional, positive, positive_int)

__all__ = ["CLLoRAConfig"]

# Where step 2's gradient (cross-entropy + orthogonality) is taken: at the batch's parameters, as the code's
# graph describes (ours), or again after step 1 has moved them (the code's order read literally).
SecondStepGradient = Literal["batch_start", "after_step_one"]
SECOND_STEP_GRADIENTS = ("batch_start", "after_step_one")


@option_group
class CLLoRAConfig(TrainingOptions, LoaderOptions):
    """Every option of :class:`~avalanche_color.CLLoRA`, with the authors' CIFAR-100 values as defaults.
    ``precision="16-mixed"`` is refused: the two SGD steps per batch are not implemented with float16's
    gradient scaler (``"bf16-mixed"`` needs none)."""

    rank: int = option(8, positive_int, expert_setting=True,
                       doc="rank of every adapter (code: 8 on CIFAR-100, 10 on ImageNet-R).")
    shared_blocks: Optional[int] = option(
        None, optional(non_negative_int), expert_setting=True,
        doc="how many first blocks hold the task-shared adapters; None: half of the blocks, rounded down (code: "
            "6 of 12). At least one block must remain task-specific.")
    lr: float = option(0.03, positive, doc="SGD's learning rate (code: 0.03 on CIFAR-100, 0.05 on ImageNet-R).")
    momentum: float = option(0.9, non_negative, doc="SGD's momentum (code: 0.9).")
    weight_decay: float = option(1e-4, non_negative,
                                 doc="SGD's weight decay (code: 1e-4 on CIFAR-100, 5e-4 on ImageNet-R).")
    train_mb_size: int = option(64, positive_int,
                                doc="training mini-batch size (code: 64 on CIFAR-100, 32 on ImageNet-R).")
    train_epochs: int = option(
        30, positive_int,
        doc="epochs per experience (code: 30 on CIFAR-100, 20 on ImageNet-R); the rate anneals per epoch as "
            "``CosineAnnealingLR(T_max=train_epochs, eta_min=0)``.")
    kd_weight: float = option(5.0, non_negative, doc="weight of the distillation of the shared blocks (code: 5).")
    kd_temperature: float = option(2.0, positive, doc="the distillation's temperature (code: 2).")
    ortho_weight: float = option(1e-4, non_negative,
                                 doc="weight of the block weights' orthogonality term (code: 1e-4).")
    second_step_gradient: SecondStepGradient = option(
        "batch_start", one_of(SECOND_STEP_GRADIENTS),
        doc='where step 2\'s gradient (cross-entropy and orthogonality) is taken: ``"batch_start"``, at the '
            'batch\'s parameters, as the code\'s graph, built before step 1, describes; ``"after_step_one"``, '
            'from a new forward at the parameters step 1 left, the code\'s order read literally (its own '
            'sequence, which current torch refuses, mixes the two).')
    init_seed: int = option(
        0, integer,
        doc="seed of each experience's new weights (and of the shared adapters), drawn apart from the global "
            "generators: a resumed run and a fresh one draw the same.")

    def _check_together(self) -> None:
        super()._check_together()
        if self.precision == "16-mixed":
            # Two optimiser steps per batch from gradients kept aside do not fit one gradient scaler's
            # skip-and-rescale rule; bfloat16 needs no scaler.
            raise ValueError("precision must be '32-true' or 'bf16-mixed' for CL-LoRA (its two SGD steps per "
                             "batch are not implemented with float16's gradient scaler), got precision='16-mixed'")

    def shared_count(self, depth: int) -> int:
        """How many of ``depth`` blocks hold the task-shared adapters: ``shared_blocks``, else the first half."""
        shared = depth // 2 if self.shared_blocks is None else self.shared_blocks
        if shared >= depth:
            raise ValueError(f"shared_blocks must leave at least one task-specific block of the ViT's {depth}, "
                             f"got shared_blocks={shared}")
        return shared
