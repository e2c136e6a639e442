"""The options every baseline takes (NCM, RanPAC, Joint-LoRA), declared once with their defaults and
checks, as the methods' options are in their configs (:mod:`avalanche_color.config`).

Each baseline still lists these options in its own ``__init__``, with the same defaults (a test checks
that they agree), so that ``help()`` and an editor show them; it builds :class:`BaselineOptions` from
them, which refuses a bad value naming the option, the value and what is allowed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

from avalanche.core import BasePlugin

from avalanche_color.utils.checks import Options, boolean, option, option_group, positive_int


def plugin_list(value: object) -> Optional[str]:
    # A lone plugin given without a list would otherwise fail later, far from the call.
    return None if value is None or isinstance(value, Sequence) else "must be a sequence of Avalanche plugins or None"


@option_group
class BaselineOptions(Options):
    """What every baseline strategy takes besides its model and its own options."""

    check_data: bool = option(
        True, boolean,
        doc="scan each training experience for bad samples (non-finite pixels, labels that are not class ids, "
            "images the ViT cannot take) before the model changes for it.")
    train_mb_size: int = option(128, positive_int, doc="training mini-batch size, as in Avalanche.")
    eval_mb_size: int = option(128, positive_int, doc="evaluation mini-batch size, as in Avalanche.")
    plugins: Optional[Sequence[BasePlugin]] = option(
        None, plugin_list, doc="the user's Avalanche plugins (a list or tuple, copied by the strategy), or None.")
