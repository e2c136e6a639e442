"""S-Prompts' options: its prompt experts (the model's options) and the whole method's config.

The option groups it shares with CoLoR (routing, prototypes, training, loaders) and the checks
are in :mod:`avalanche_color.config`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from avalanche_color.config import DISTANCES, Distance, RoutedExpertsConfig, RoutingOptions, option
from avalanche_color.utils.checks import one_of, positive, positive_int

Schedule = Literal["cosine", "epoch_cosine"]
SCHEDULES: tuple[str, ...] = Schedule.__args__  # type: ignore[attr-defined]


@dataclass(frozen=True, kw_only=True)
class PromptOptions(RoutingOptions):
    """S-Prompts' model options: prompt tokens inserted behind the [CLS] token, and how samples
    are routed to the experts.

    Attributes:
        prompt_length: tokens per expert (S-Prompts: 10); at least 1.
        distance: routing distance; L1 as S-Prompts' code (``methods/sprompt.py``), where CoLoR's
            authors' code routes by Euclidean distance.
    """

    prompt_length: int = option(10, positive_int, expert_setting=True)
    distance: Distance = option("l1", one_of(DISTANCES), expert_setting=True)


@dataclass(frozen=True, kw_only=True)
class SPromptsConfig(PromptOptions, RoutedExpertsConfig):
    """S-Prompts' options, the fields of :class:`~avalanche_color.SPrompts`'s keyword arguments;
    defaults from its published configs (prompt length 10, lr 0.01).

    Attributes:
        lr_schedule: ``"cosine"``: annealed to zero over each experience's steps (CoLoR's); ``"epoch_cosine"``:
            S-Prompts' code's ``CosineAnnealingLR(T_max=epochs)`` stepped after each epoch (epoch e of E at
            ``lr (1 + cos(pi e / E)) / 2``: the first at lr, the last above zero).
    """

    lr: float = option(0.01, positive)
    lr_schedule: Schedule = option("cosine", one_of(SCHEDULES))
