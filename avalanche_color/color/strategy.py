"""CoLoR as an Avalanche strategy: LoRA experts trained one per experience, prototype routing."""

from collections.abc import Sequence
from typing import Any, ClassVar, Optional, Union

import torch
from avalanche.core import BasePlugin
from avalanche.training.plugins.evaluation import default_evaluator
from torch import nn

from avalanche_color.color.config import CoLoRConfig, LoRAOptions
from avalanche_color.color.model import ExpertViT
from avalanche_color.config import (CandidateRule, ConfidenceScore, Distance, Precision, PrototypeData, Rematching,
                                    RematchingCandidate, Router, RoutingFeatures)
from avalanche_color.training.strategy import Evaluator, RoutedExpertsTemplate


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
    :class:`~avalanche_color.color.config.CoLoRConfig`, declared, checked and documented there;
    ``__init__`` lists them with their types and defaults.
    """

    model: ExpertViT
    config: CoLoRConfig
    config_class: ClassVar[type[CoLoRConfig]] = CoLoRConfig
    model_class: ClassVar[type[ExpertViT]] = ExpertViT
    model_config_class: ClassVar[type[LoRAOptions]] = LoRAOptions

    def __init__(
        self,
        model: nn.Module,
        config: Optional[CoLoRConfig] = None,
        *,
        # LoRAOptions
        rank: int = CoLoRConfig.rank,
        alpha: Optional[float] = CoLoRConfig.alpha,
        warm_start: bool = CoLoRConfig.warm_start,
        top_m: int = CoLoRConfig.top_m,
        top_m_rule: CandidateRule = CoLoRConfig.top_m_rule,
        rematching: Rematching = CoLoRConfig.rematching,
        rematching_score: ConfidenceScore = CoLoRConfig.rematching_score,
        rematching_tau: float = CoLoRConfig.rematching_tau,
        rematching_candidate: RematchingCandidate = CoLoRConfig.rematching_candidate,
        # RoutingOptions
        routing_features: RoutingFeatures = CoLoRConfig.routing_features,
        router: Router = CoLoRConfig.router,
        router_width: int = CoLoRConfig.router_width,
        distance: Distance = CoLoRConfig.distance,
        normalize_features: bool = CoLoRConfig.normalize_features,
        cache_evaluation: bool = CoLoRConfig.cache_evaluation,
        cache_evaluation_bytes: int = CoLoRConfig.cache_evaluation_bytes,
        # PrototypeOptions
        k: int = CoLoRConfig.k,
        kmeans_seed: int = CoLoRConfig.kmeans_seed,
        kmeans_n_init: int = CoLoRConfig.kmeans_n_init,
        prototype_data: PrototypeData = CoLoRConfig.prototype_data,
        prototype_batch_size: Optional[int] = CoLoRConfig.prototype_batch_size,
        prototypes_per_class: Optional[int] = CoLoRConfig.prototypes_per_class,
        # ExpertTrainingOptions
        momentum: float = CoLoRConfig.momentum,
        weight_decay: float = CoLoRConfig.weight_decay,
        # TrainingOptions
        lr: float = CoLoRConfig.lr,
        train_mb_size: int = CoLoRConfig.train_mb_size,
        train_epochs: int = CoLoRConfig.train_epochs,
        eval_mb_size: int = CoLoRConfig.eval_mb_size,
        eval_every: int = CoLoRConfig.eval_every,
        check_data: bool = CoLoRConfig.check_data,
        # PrecisionOptions
        precision: Precision = CoLoRConfig.precision,
        # LoaderOptions
        num_workers: int = CoLoRConfig.num_workers,
        pin_memory: Optional[bool] = CoLoRConfig.pin_memory,
        persistent_workers: bool = CoLoRConfig.persistent_workers,
        # Avalanche's (StrategyBase)
        criterion: Optional[nn.Module] = None,
        device: Union[str, torch.device] = "cpu",
        plugins: Optional[Sequence[BasePlugin]] = None,
        evaluator: Evaluator = default_evaluator,
        **template_options: Any,
    ) -> None:
        """CoLoR on ``model``, with the options of ``config`` and those given here (the others: their
        defaults).

        Each option (``rank`` to ``persistent_workers``) is a field of
        :class:`~avalanche_color.color.config.CoLoRConfig`, documented there; its default is the config's.
        ``criterion``, ``device``, ``plugins``, ``evaluator`` and Avalanche's other keywords: as
        :class:`~avalanche_color.training.strategy.StrategyBase` says.

        Args:
            model: a timm ``VisionTransformer``, of which the strategy builds its
                :class:`~avalanche_color.color.model.ExpertViT` on a copy (the ViT given stays as it was); or a
                :class:`~avalanche_color.color.model.ExpertViT` (a strategy's ``model``) to continue from: its own
                settings (``rank``, ``alpha``, ``warm_start``, ``top_m``, ``top_m_rule``, ``rematching``,
                ``rematching_score``, ``rematching_tau``, ``rematching_candidate``, ``routing_features``,
                ``router``, ``router_width``, ``distance``, ``normalize_features``, ``cache_evaluation``,
                ``cache_evaluation_bytes``) then apply, and one given another value is refused.
            config: all options as one :class:`~avalanche_color.color.config.CoLoRConfig`; an option given here
                replaces its field.
        """
        options = dict(
            rank=rank, alpha=alpha, warm_start=warm_start, top_m=top_m, top_m_rule=top_m_rule,
            rematching=rematching, rematching_score=rematching_score, rematching_tau=rematching_tau,
            rematching_candidate=rematching_candidate, routing_features=routing_features, router=router,
            router_width=router_width, distance=distance, normalize_features=normalize_features,
            cache_evaluation=cache_evaluation, cache_evaluation_bytes=cache_evaluation_bytes, k=k,
            kmeans_seed=kmeans_seed, kmeans_n_init=kmeans_n_init, prototype_data=prototype_data,
            prototype_batch_size=prototype_batch_size, prototypes_per_class=prototypes_per_class, momentum=momentum,
            weight_decay=weight_decay, lr=lr, train_mb_size=train_mb_size, train_epochs=train_epochs,
            eval_mb_size=eval_mb_size, eval_every=eval_every, check_data=check_data, precision=precision,
            num_workers=num_workers, pin_memory=pin_memory, persistent_workers=persistent_workers)
        super().__init__(model=model, config=config, options=options, criterion=criterion, device=device,
                         plugins=plugins, evaluator=evaluator, template_options=template_options)
