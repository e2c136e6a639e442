"""CoLoR as an Avalanche strategy: LoRA experts trained one per experience, prototype routing."""

from __future__ import annotations

from typing import ClassVar

from avalanche_color.color.model import ExpertViT
from avalanche_color.color.config import CoLoRConfig
from avalanche_color.training.template import RoutedExpertsTemplate


class CoLoR(RoutedExpertsTemplate):
    """Continual Learning with Low Rank Adaptation (Wistuba et al., 2023).

    Each training experience gets its own expert (rank-r LoRA on q and v of
    every block of a frozen ViT, plus a linear head), trained with SGD and a
    cosine schedule that restarts per experience. After each experience,
    k-means over the experience's features gives k prototypes; at evaluation
    every sample goes to the expert of its nearest prototype::

        strategy = CoLoR(vit, rank=8, k=20)
        strategy = CoLoR(vit, CoLoRConfig(rank=8, k=20), device="cuda")   # the same options, as one object

    Options are the fields of :class:`~avalanche_color.config.CoLoRConfig`, with the
    paper's defaults: ``rank`` (64), ``alpha`` (= rank), ``routing`` (``"backbone"``;
    ``"first_expert"`` is CoLoR++, ``"oracle"`` routes by task label), ``distance``,
    ``k`` (5; the paper: 20 class-incremental), ``lr`` (1e-3), ``momentum``,
    ``weight_decay``, ``train_mb_size`` (128), ``train_epochs`` (50), ``eval_mb_size``,
    ``eval_every``, k-means and prototype settings, ``check_data``, ``cache_evaluation``.

    Args:
        model: a timm ``VisionTransformer`` (CoLoR adapts a copy of it; the ViT given
            stays as it was), or an :class:`~avalanche_color.ExpertViT` to continue from
            (then its own model options, those of ``LoRAOptions``: rank, alpha, routing,
            distance, ..., apply and must stay unset; training options may be given).
        config: a :class:`~avalanche_color.config.CoLoRConfig`; keyword options replace its fields.
        criterion, device, plugins, evaluator, and Avalanche's other keywords: see
            :class:`~avalanche_color.training.configured_strategy.ConfiguredStrategy`.
    """

    model: ExpertViT
    config: CoLoRConfig
    config_class: ClassVar[type[CoLoRConfig]] = CoLoRConfig
    model_class: ClassVar[type[ExpertViT]] = ExpertViT
