"""S-Prompts as an Avalanche strategy: CoLoR's training and routing with prompt-token experts."""

from collections.abc import Sequence
from typing import Any, ClassVar, Optional, Union

import torch
from avalanche.core import BasePlugin
from avalanche.training.plugins.evaluation import default_evaluator
from torch import nn

from avalanche_color.config import Precision, PrototypeData, Router, RoutingFeatures
from avalanche_color.peers.s_prompts.config import Distance, PromptOptions, SPromptsConfig, Schedule
from avalanche_color.peers.s_prompts.model import PromptExpertViT
from avalanche_color.training.strategy import Evaluator, RoutedExpertsTemplate


class SPrompts(RoutedExpertsTemplate):
    """S-Prompts (Wang et al., NeurIPS 2022), image-prompt variant (S-iPrompts), on any timm ViT.

    Each training experience gets its own expert: ``prompt_length`` learnable
    tokens inserted behind the [CLS] token of a frozen ViT, plus a linear head
    on the [CLS] feature. Everything else is CoLoR's, from the same code: SGD
    with a cosine schedule restarting per experience, k-means prototypes of the
    frozen backbone's features after each experience, nearest-prototype routing
    per sample at evaluation, by L1 distance as S-Prompts' own code
    (``distance="euclidean"``: CoLoR's).

    ``lr_schedule="epoch_cosine"``: the cosine per epoch of S-Prompts' code instead.

    Defaults: prompt length 10, lr 0.01, SGD momentum 0.9, weight decay 2e-4, batch 128
    (S-Prompts' published configs); k 5 (S-Prompts' and the CoLoR paper's choice for
    domain-incremental streams); 50 epochs like CoLoR. The options are the fields of
    :class:`~avalanche_color.peers.s_prompts.config.SPromptsConfig`, declared and checked there.
    """

    model: PromptExpertViT
    config: SPromptsConfig
    config_class: ClassVar[type[SPromptsConfig]] = SPromptsConfig
    model_class: ClassVar[type[PromptExpertViT]] = PromptExpertViT
    model_config_class: ClassVar[type[PromptOptions]] = PromptOptions

    def __init__(
        self,
        model: nn.Module,
        config: Optional[SPromptsConfig] = None,
        *,
        lr: float = SPromptsConfig.lr,
        lr_schedule: Schedule = SPromptsConfig.lr_schedule,
        # PromptOptions
        prompt_length: int = SPromptsConfig.prompt_length,
        distance: Distance = SPromptsConfig.distance,
        # RoutingOptions
        routing_features: RoutingFeatures = SPromptsConfig.routing_features,
        router: Router = SPromptsConfig.router,
        router_width: int = SPromptsConfig.router_width,
        normalize_features: bool = SPromptsConfig.normalize_features,
        cache_evaluation: bool = SPromptsConfig.cache_evaluation,
        cache_evaluation_bytes: int = SPromptsConfig.cache_evaluation_bytes,
        # PrototypeOptions
        k: int = SPromptsConfig.k,
        kmeans_seed: int = SPromptsConfig.kmeans_seed,
        kmeans_n_init: int = SPromptsConfig.kmeans_n_init,
        prototype_data: PrototypeData = SPromptsConfig.prototype_data,
        prototype_batch_size: Optional[int] = SPromptsConfig.prototype_batch_size,
        prototypes_per_class: Optional[int] = SPromptsConfig.prototypes_per_class,
        # ExpertTrainingOptions
        momentum: float = SPromptsConfig.momentum,
        weight_decay: float = SPromptsConfig.weight_decay,
        # TrainingOptions
        train_mb_size: int = SPromptsConfig.train_mb_size,
        train_epochs: int = SPromptsConfig.train_epochs,
        eval_mb_size: int = SPromptsConfig.eval_mb_size,
        eval_every: int = SPromptsConfig.eval_every,
        check_data: bool = SPromptsConfig.check_data,
        # PrecisionOptions
        precision: Precision = SPromptsConfig.precision,
        # LoaderOptions
        num_workers: int = SPromptsConfig.num_workers,
        pin_memory: Optional[bool] = SPromptsConfig.pin_memory,
        persistent_workers: bool = SPromptsConfig.persistent_workers,
        # Avalanche's (StrategyBase)
        criterion: Optional[nn.Module] = None,
        device: Union[str, torch.device] = "cpu",
        plugins: Optional[Sequence[BasePlugin]] = None,
        evaluator: Evaluator = default_evaluator,
        **template_options: Any,
    ) -> None:
        """S-Prompts on ``model``, with the options of ``config`` and those given here (the others: their
        defaults).

        Each option (``lr`` to ``persistent_workers``) is a field of
        :class:`~avalanche_color.peers.s_prompts.config.SPromptsConfig`, documented there; its default is the
        config's. ``criterion``, ``device``, ``plugins``, ``evaluator`` and Avalanche's other keywords: as
        :class:`~avalanche_color.training.strategy.StrategyBase` says.

        Args:
            model: a timm ``VisionTransformer``, of which the strategy builds its
                :class:`~avalanche_color.peers.s_prompts.model.PromptExpertViT` on a copy (the ViT given stays as it
                was); or a :class:`~avalanche_color.peers.s_prompts.model.PromptExpertViT` (a strategy's ``model``)
                to continue from: its own settings (``prompt_length``, ``distance``, ``routing_features``,
                ``router``, ``router_width``, ``normalize_features``, ``cache_evaluation``,
                ``cache_evaluation_bytes``) then apply, and one given another value is refused.
            config: all options as one :class:`~avalanche_color.peers.s_prompts.config.SPromptsConfig`; an option
                given here replaces its field.
        """
        options = dict(
            lr=lr, lr_schedule=lr_schedule, prompt_length=prompt_length, distance=distance,
            routing_features=routing_features, router=router, router_width=router_width,
            normalize_features=normalize_features, cache_evaluation=cache_evaluation,
            cache_evaluation_bytes=cache_evaluation_bytes, k=k, kmeans_seed=kmeans_seed,
            kmeans_n_init=kmeans_n_init, prototype_data=prototype_data, prototype_batch_size=prototype_batch_size,
            prototypes_per_class=prototypes_per_class, momentum=momentum, weight_decay=weight_decay,
            train_mb_size=train_mb_size, train_epochs=train_epochs, eval_mb_size=eval_mb_size,
            eval_every=eval_every, check_data=check_data, precision=precision, num_workers=num_workers,
            pin_memory=pin_memory, persistent_workers=persistent_workers)
        super().__init__(model=model, config=config, options=options, criterion=criterion, device=device,
                         plugins=plugins, evaluator=evaluator, template_options=template_options)

    def restart_schedule(self) -> None:
        """As ``lr_schedule``: the template's cosine per step, or S-Prompts' code's cosine per epoch."""
        if self.config.lr_schedule == "epoch_cosine":
            return self.restart_cosine_per_epoch()
        super().restart_schedule()
