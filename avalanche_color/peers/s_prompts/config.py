"""S-Prompts' options: its prompt experts (the model's options) and the whole method's config.

The option groups it shares with CoLoR (routing, prototypes, training, loaders) and the checks
are in :mod:`avalanche_color.config`.
"""

from __future__ import annotations

from typing import Literal, get_args

from avalanche_color.config import DISTANCES, Distance, RoutedExpertsConfig, RoutingOptions
from avalanche_color.utils.checks import one_of, option, option_group, positive, positive_int

Schedule = Literal["cosine", "epoch_cosine"]
SCHEDULES: tuple[str, ...] = get_args(Schedule)


@option_group
class PromptOptions(RoutingOptions):
    """S-Prompts' model options: prompt tokens inserted behind the [CLS] token, and how samples
    are routed to the experts."""

    prompt_length: int = option(10, positive_int, expert_setting=True,
                                doc="prompt tokens per expert, inserted behind the [CLS] token (S-Prompts: 10).")
    distance: Distance = option(
        "l1", one_of(DISTANCES), expert_setting=True,
        doc='between features and prototypes: ``"l1"``, as S-Prompts\' code (``methods/sprompt.py``); '
            '``"euclidean"``, as CoLoR\'s authors\' code; or ``"cosine"``.')


@option_group
class SPromptsConfig(PromptOptions, RoutedExpertsConfig):
    """S-Prompts' options, the keyword arguments of :class:`~avalanche_color.SPrompts`;
    defaults from its published configs (prompt length 10, lr 0.01)."""

    lr: float = option(
        0.01, positive,
        doc="SGD's learning rate (S-Prompts' published configs: 0.01), annealed as ``lr_schedule`` says.")
    lr_schedule: Schedule = option(
        "cosine", one_of(SCHEDULES),
        doc='``"cosine"``: annealed to zero over each experience\'s steps, stepped after every optimiser step '
            '(CoLoR\'s); ``"epoch_cosine"``: as S-Prompts\' code, ``CosineAnnealingLR(T_max=epochs)`` stepped '
            'after each epoch: epoch e of E at ``lr (1 + cos(pi e / E)) / 2``, the first at lr, the last above '
            'zero (9.5% of lr for 5 epochs).')
