"""InfLoRA's options, declared and checked once (:class:`InfLoRAConfig`).

Defaults are the official code's Split CIFAR-100 run (liangyanshuo/InfLoRA,
``configs/cifar100_inflora.json`` with ``methods/inflora.py``): rank 10, Adam (betas 0.9,
0.999) at lr 5e-4, no weight decay, a cosine schedule, batch 128, 20 epochs, and the
DualGPM threshold rising from ``lamb`` 0.95 to ``lame`` 1.0 over the stream's tasks
(ImageNet-R: 0.98, 50 epochs; DomainNet: rank 30, SGD lr 0.005, 5 epochs).
"""

from __future__ import annotations

from typing import Optional

from avalanche_color.peers.lora_sum.config import SCHEDULES, LoRASumTraining, Optimizer, Schedule
from avalanche_color.utils.checks import fraction, one_of, option, option_group, optional, positive, positive_int

__all__ = ["InfLoRAConfig", "Optimizer", "Schedule"]


@option_group
class InfLoRAConfig(LoRASumTraining):
    """Every option of :class:`~avalanche_color.InfLoRA`: its subspaces', and the shared training group with
    the code's Adam at lr 5e-4, cosine."""

    rank: int = option(10, positive_int, expert_setting=True,
                       doc="rank of each experience's branch (code: 10 on CIFAR-100 and ImageNet-R, 30 on DomainNet).")
    threshold: float = option(
        0.95, fraction, expert_setting=True,
        doc="epsilon, the fraction of an experience's input energy the protected subspace keeps (code: 0.95 on "
            "CIFAR-100, 0.98 on ImageNet-R).")
    final_threshold: float = option(
        1.0, fraction, expert_setting=True,
        doc="epsilon reached at the last experience when ``num_experiences`` is given (code: 1.0).")
    num_experiences: Optional[int] = option(
        None, optional(positive_int), expert_setting=True,
        doc="the stream's length T: epsilon_t rises from ``threshold`` to ``final_threshold`` as ``threshold + "
            "(final_threshold - threshold) t / T`` (the code's ``lamb``, ``lame``); None keeps ``threshold``.")
    optimizer: Optimizer = option("adam", one_of(("sgd", "adam")),
                                  doc='``"adam"`` (betas 0.9, 0.999, the code\'s) or ``"sgd"`` (with ``momentum``).')
    lr: float = option(5e-4, positive, doc="learning rate (code: 5e-4).")
    lr_schedule: Schedule = option(
        "cosine", one_of(SCHEDULES),
        doc='``"cosine"`` over each experience\'s steps to 0; ``"epoch_cosine"``, the code\'s per-epoch cosine as '
            'it runs, one epoch late (9.7% of lr in the last of 20 epochs; the fidelity page measures the '
            'difference); or ``"constant"``.')

    def _check_together(self) -> None:
        super()._check_together()
        if self.final_threshold < self.threshold:
            raise ValueError(f"final_threshold must be at least threshold={self.threshold}, "
                             f"got final_threshold={self.final_threshold}")

    def threshold_at(self, task: int) -> float:
        """epsilon for the ``task``-th experience (0-based): the code's ``lamb + (lame - lamb) t / T``."""
        if self.num_experiences is None:
            return self.threshold
        progress = min(task, self.num_experiences) / self.num_experiences
        return self.threshold + (self.final_threshold - self.threshold) * progress
