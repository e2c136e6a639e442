"""How SD-LoRA and InfLoRA train: the option group their configs share (:class:`LoRASumTraining`), and the
option types of the LoRA-sum family (``Optimizer``, ``Schedule``, ``DirectionNorm``).

Both official codes train each experience with one optimiser over what learns, a constant or
cosine learning rate, batch 128 and 20 epochs; they differ in the optimiser, its rate and the
schedule, which each method's config sets to its code's values.
"""

from __future__ import annotations

from typing import Literal, get_args

from avalanche_color.config import LoaderOptions, TrainingOptions
from avalanche_color.utils.checks import integer, non_negative, one_of, option, option_group, positive_int

Optimizer = Literal["sgd", "adam"]
Schedule = Literal["constant", "cosine", "epoch_cosine"]
SCHEDULES: tuple[str, ...] = get_args(Schedule)
# The norm a normalised direction is divided by (SD-LoRA's ``direction_norm``; the layer's Mixing reads it):
# ``||B||_F ||A||_F`` (the SD-LoRA code) or ``||B A||_F`` (its paper).
DirectionNorm = Literal["factors", "product"]


@option_group
class LoRASumTraining(TrainingOptions, LoaderOptions):
    """The optimiser, schedule, budget and loaders of a LoRA-sum method; each method's config sets the
    defaults of its code."""

    optimizer: Optimizer = option("sgd", one_of(("sgd", "adam")),
                                  doc='``"sgd"`` (with ``momentum``) or ``"adam"`` (betas 0.9, 0.999).')
    momentum: float = option(0.9, non_negative, doc="SGD's momentum.")
    weight_decay: float = option(0.0, non_negative, doc="the optimiser's weight decay.")
    lr_schedule: Schedule = option(
        "constant", one_of(SCHEDULES),
        doc='``"constant"``, ``"cosine"`` over each experience\'s steps to 0, or ``"epoch_cosine"``: InfLoRA\'s '
            'code\'s per-epoch cosine as it runs (one epoch late: 9.7% of lr in the last of 20 epochs).')
    train_epochs: int = option(20, positive_int)
    init_seed: int = option(
        0, integer,
        doc="seed of each new component's and head rows' random initialisation, drawn apart from the global "
            "generators: a run under torchrun, a resumed run and a single process draw the same.")
