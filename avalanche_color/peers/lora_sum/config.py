"""How SD-LoRA and InfLoRA train: the option group their configs share (:class:`LoRASumTraining`), and the
option types of the LoRA-sum family (``Optimizer``, ``Schedule``, ``DirectionNorm``).

Both official codes train each experience with one optimiser over what learns, a constant or
cosine learning rate, batch 128 and 20 epochs; they differ in the optimiser, its rate and the
schedule, which each method's config sets to its code's values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from avalanche_color.config import LoaderOptions, TrainingOptions, option
from avalanche_color.utils.checks import integer, non_negative, one_of, positive_int

Optimizer = Literal["sgd", "adam"]
Schedule = Literal["constant", "cosine", "epoch_cosine"]
SCHEDULES: tuple[str, ...] = Schedule.__args__  # type: ignore[attr-defined]
# The norm a normalised direction is divided by (SD-LoRA's ``direction_norm``; the layer's Mixing reads it):
# ``||B||_F ||A||_F`` (the SD-LoRA code) or ``||B A||_F`` (its paper).
DirectionNorm = Literal["factors", "product"]


@dataclass(frozen=True, kw_only=True)
class LoRASumTraining(LoaderOptions, TrainingOptions):
    """The optimiser, schedule, budget and loaders of a LoRA-sum method (meanings: the strategies' docstrings).

    Attributes:
        optimizer: ``"sgd"`` (with ``momentum``) or ``"adam"`` (betas 0.9, 0.999).
        momentum, weight_decay: the optimiser's.
        lr_schedule: ``"constant"``, ``"cosine"`` over each experience's steps, or ``"epoch_cosine"``:
            InfLoRA's code's per-epoch cosine as it runs (one epoch late: 9.7% of lr in the last of 20).
        init_seed: seed of each new component's and head rows' initialisation, drawn apart from the
            global generators.
    """

    optimizer: Optimizer = option("sgd", one_of(("sgd", "adam")))
    momentum: float = option(0.9, non_negative)
    weight_decay: float = option(0.0, non_negative)
    lr_schedule: Schedule = option("constant", one_of(SCHEDULES))
    train_epochs: int = option(20, positive_int)
    init_seed: int = option(0, integer)
