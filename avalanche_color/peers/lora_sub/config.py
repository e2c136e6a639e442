"""LoRA subtraction's options, declared and checked once (:class:`LoRASubtractionConfig`).

Defaults are the authors' Split CIFAR-100 run (scarlet0703/LoRA-Sub-DRS at 836ad29,
``configs/cifar100.json`` with ``methods/lorasub_drs.py``): rank 10, their Adam at lr 5e-4 for the
LoRA weights and 2e-3 for the head, no weight decay, the per-epoch cosine, batch 128, 20 epochs,
the subspace threshold 0.99 (hard-coded there), the triplet margin 1.0 and weight 0.05
(ImageNet-R: margin 2.0, weight 0.2, head lr 5e-4, 50 epochs, 40 in the first task).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from avalanche_color.config import LoaderOptions, TrainingOptions, option
from avalanche_color.peers.lora_sum.config import SCHEDULES, Schedule
from avalanche_color.utils.checks import fraction, integer, non_negative, one_of, optional, positive, positive_int

__all__ = ["LoRASubtractionConfig", "SameClassPrototypes", "Schedule"]

SameClassPrototypes = Literal["include", "exclude"]
SAME_CLASS_PROTOTYPES: tuple[str, ...] = SameClassPrototypes.__args__  # type: ignore[attr-defined]


@dataclass(frozen=True, kw_only=True)
class LoRASubtractionConfig(LoaderOptions, TrainingOptions):
    """Every option of :class:`~avalanche_color.peers.lora_sub.strategy.LoRASubtraction` (see its
    docstring for each one's meaning), with the authors' CIFAR-100 values as defaults."""

    rank: int = option(10, positive_int, expert_setting=True)
    threshold: float = option(0.99, fraction)
    margin: float = option(1.0, positive)
    triplet_weight: float = option(0.05, non_negative)
    same_class_prototypes: SameClassPrototypes = option("include", one_of(SAME_CLASS_PROTOTYPES))
    lr: float = option(5e-4, positive)
    head_lr: float = option(2e-3, positive)
    weight_decay: float = option(0.0, non_negative)
    lr_schedule: Schedule = option("epoch_cosine", one_of(SCHEDULES))
    train_epochs: int = option(20, positive_int)
    first_experience_epochs: Optional[int] = option(None, optional(positive_int))
    init_seed: int = option(0, integer)
