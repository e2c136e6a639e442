"""The baselines' options, each declared once with its default, check and doc, as the methods' are in their
configs (:mod:`avalanche_color.config`): :class:`BaselineOptions`, what every baseline takes, and the group
of each baseline that has options of its own (:class:`RanPACOptions`, :class:`JointLoRAOptions`; NCM has
none).

Each baseline's ``__init__`` lists its group's options as keywords, with their types and these defaults
(``width: int = RanPACOptions.width``), and builds its config from those given; a bad value is refused naming
the option, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses

from avalanche_color.config import PrecisionOptions
from avalanche_color.utils.checks import (Options, boolean, integer, non_negative, option, option_group, positive,
                                          positive_int)


@option_group
class BaselineOptions(Options):
    """What every baseline strategy takes besides its model: the data checks and Avalanche's mini-batch sizes.
    NCM's options, all of them."""

    check_data: bool = option(
        True, boolean,
        doc="scan each training experience for bad samples (non-finite pixels, labels that are not class ids, "
            "images the ViT cannot take) before the model changes for it "
            "(:class:`~avalanche_color.DataChecksPlugin`).")
    train_mb_size: int = option(
        128, positive_int,
        doc="training mini-batch size, as in Avalanche (NCM and RanPAC: the batches in which the training data's "
            "features are computed).")
    eval_mb_size: int = option(128, positive_int, doc="evaluation mini-batch size, as in Avalanche.")


@option_group
class RanPACOptions(BaselineOptions):
    """RanPAC's options (:class:`~avalanche_color.RanPAC`)."""

    width: int = option(
        2048, positive_int,
        doc="M, the random ReLU features. RanPAC uses 10,000 for ViT-B/16's 768-wide features; the default keeps "
            "the M x M solve cheap on a CPU, and is the width of CoLoR's ridge router.")
    seed: int = option(0, integer, doc="seed of the random projection.")


@option_group
class JointLoRAOptions(BaselineOptions, PrecisionOptions):
    """Joint-LoRA's options (:class:`~avalanche_color.JointLoRA`). ``num_classes`` has no default: a user gives
    it; the others' defaults are CoLoR's (:class:`~avalanche_color.CoLoRConfig`, the CoLoR paper's)."""

    num_classes: int = option(
        dataclasses.MISSING, positive_int,
        doc="the head's classes, ids ``0 .. num_classes - 1`` (every class of the stream: the head exists before "
            "the one training on all of them).")
    rank: int = option(64, positive_int, doc="LoRA rank r on the query and value projections of every block.")
    lr: float = option(1e-3, positive, doc="SGD's learning rate at the first step (cosine-annealed to zero).")
    momentum: float = option(0.9, non_negative, doc="SGD's momentum.")
    weight_decay: float = option(2e-4, non_negative, doc="SGD's weight decay.")
    train_epochs: int = option(50, positive_int, doc="epochs over the whole stream.")
