"""CoLoR as an Avalanche strategy: LoRA experts trained one per experience, prototype routing."""

from __future__ import annotations

from typing import ClassVar

from avalanche_color.color.config import CoLoRConfig, LoRAOptions
from avalanche_color.color.model import ExpertViT
from avalanche_color.training.strategy import RoutedExpertsTemplate


class CoLoR(RoutedExpertsTemplate):
    """Continual Learning with Low Rank Adaptation (Wistuba et al., 2023).

    Each training experience gets its own expert (rank-r LoRA on q and v of
    every block of a frozen ViT, plus a linear head), trained with SGD and a
    cosine schedule that restarts per experience. After each experience,
    k-means over the experience's features gives k prototypes; at evaluation
    every sample goes to the expert of its nearest prototype. For example:

        strategy = CoLoR(vit, rank=8, k=20)
        strategy = CoLoR(vit, config=CoLoRConfig(rank=8, k=20), device="cuda")  # the same options, as one object

    The defaults are the paper's. The options are the fields of
    :class:`~avalanche_color.color.config.CoLoRConfig`, declared and checked there; ``__init__``
    lists them with their defaults and docs.
    """

    model: ExpertViT
    config: CoLoRConfig
    config_class: ClassVar[type[CoLoRConfig]] = CoLoRConfig
    model_class: ClassVar[type[ExpertViT]] = ExpertViT
    model_config_class: ClassVar[type[LoRAOptions]] = LoRAOptions
