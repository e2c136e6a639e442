"""CoLoR as an Avalanche strategy: LoRA experts trained one per experience, prototype routing."""

# No `from __future__ import annotations`: help() and inspect.signature show the evaluated types.
from collections.abc import Sequence
from typing import Any, Callable, ClassVar, Optional, Union

import torch
from avalanche.core import BasePlugin
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.plugins.evaluation import default_evaluator
from torch import nn

from avalanche_color.color.config import CoLoRConfig, LoRAOptions
from avalanche_color.color.model import ExpertViT
from avalanche_color.config import Distance, Precision, PrototypeData, Router, RoutingFeatures
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

    The defaults are the paper's. Every option is a field of
    :class:`~avalanche_color.color.config.CoLoRConfig` with the same default, checked there.
    """

    model: ExpertViT
    config: CoLoRConfig
    config_class: ClassVar[type[CoLoRConfig]] = CoLoRConfig
    model_class: ClassVar[type[ExpertViT]] = ExpertViT
    model_config_class: ClassVar[type[LoRAOptions]] = LoRAOptions

    def __init__(
        self,
        model: nn.Module,
        *,
        config: Optional[CoLoRConfig] = None,
        rank: int = 64,
        alpha: Optional[float] = None,
        routing_features: RoutingFeatures = "backbone",
        router: Router = "prototypes",
        router_width: int = 2048,
        distance: Distance = "euclidean",
        normalize_features: bool = True,
        cache_evaluation: bool = False,
        cache_evaluation_bytes: int = 1073741824,
        k: int = 5,
        kmeans_seed: int = 0,
        kmeans_n_init: int = 10,
        prototype_data: PrototypeData = "train",
        prototype_batch_size: Optional[int] = None,
        prototypes_per_class: Optional[int] = None,
        lr: float = 1e-3,
        momentum: float = 0.9,
        weight_decay: float = 2e-4,
        train_mb_size: int = 128,
        train_epochs: int = 50,
        eval_mb_size: int = 128,
        eval_every: int = -1,
        precision: Precision = "32-true",
        check_data: bool = True,
        num_workers: int = 0,
        pin_memory: Optional[bool] = None,
        persistent_workers: bool = False,
        criterion: Optional[nn.Module] = None,
        device: Union[str, torch.device] = "cpu",
        plugins: Optional[Sequence[BasePlugin]] = None,
        evaluator: Union[EvaluationPlugin, Callable[[], EvaluationPlugin]] = default_evaluator,
        **kwargs: Any,
    ) -> None:
        """
        Args:
            model: a timm ``VisionTransformer`` (CoLoR adapts a copy of it; the ViT given stays
                as it was), or an :class:`~avalanche_color.ExpertViT` (a strategy's ``model``) to
                continue from: then its own options (rank, alpha and the routing options) apply,
                and giving one a value other than its default and the model's is refused.
            config: all options as one :class:`~avalanche_color.color.config.CoLoRConfig`;
                options given beside it with a value other than their default replace its fields.
            rank: LoRA rank r on the query and value projections of every block (the paper: 64).
            alpha: LoRA alpha; updates are scaled by ``alpha / rank``. None: ``rank``.
            routing_features: where the features that prototypes are made of and samples are
                routed by come from: ``"backbone"``, the frozen ViT (CoLoR), or
                ``"first_expert"``, the ViT with the first expert (CoLoR++).
            router: what picks each sample's expert: ``"prototypes"``, the nearest k-means
                prototype (the paper); ``"oracle"``, the expert of the sample's task label (the
                task-incremental upper bound); beyond the paper, class-level routers over
                (expert, class) pairs: ``"ridge"`` (RanPAC's ridge over random ReLU features)
                or ``"gaussian"`` (per-pair means, one shared covariance).
            router_width: the ridge router's random features M (its statistics: M² float64 numbers).
            distance: between features and prototypes: ``"euclidean"``, ``"l1"`` or ``"cosine"``.
            normalize_features: L2-normalise features before clustering and routing.
            cache_evaluation: reuse routing features and frozen experts' outputs across
                evaluations (exact; pays off when one test stream is evaluated after every
                experience with deterministic transforms).
            cache_evaluation_bytes: the most host memory the evaluation cache takes (default 1 GiB: the
                routing features of about 170,000 images of a ViT-B/16); the oldest entries go first.
            k: prototypes per experience (the paper: 5 domain-incremental, 20 class-incremental).
            kmeans_seed: k-means ``random_state``.
            kmeans_n_init: k-means restarts (explicit: scikit-learn's default changed in 1.4).
            prototype_data: embed each experience with its ``"train"`` transforms (as the loader
                gives it, S-Prompts' choice) or its ``"eval"`` transforms.
            prototype_batch_size: batch size of the embedding pass; None: ``eval_mb_size``.
            prototypes_per_class: beyond the paper: this many k-means centres within each class
                of the experience instead of ``k`` over the whole experience; None: off.
            lr: SGD's learning rate, cosine-annealed over each experience.
            momentum: SGD's momentum.
            weight_decay: SGD's weight decay.
            train_mb_size: training mini-batch size.
            train_epochs: epochs per experience.
            eval_mb_size: evaluation mini-batch size.
            eval_every: Avalanche's periodic evaluation during training: every that many epochs
                (or iterations, with ``peval_mode="iteration"``); 0: at the end of each experience
                only; -1: never.
            precision: ``"32-true"`` (float32); ``"bf16-mixed"`` or ``"16-mixed"``: each forward and its loss
                under bfloat16 or float16 autocast, the trained weights kept float32 (float16 with a gradient
                scaler; see :class:`~avalanche_color.training.strategy.MixedPrecision`). A ViT given in bfloat16 stays so (half
                its memory) and computes in bfloat16 under ``"32-true"`` too; the experts and heads are float32
                beside it all the same.
            check_data: scan each training experience for bad data before its expert exists.
            num_workers: DataLoader worker processes of every loader (0: in this process).
            pin_memory: page-locked batches; None: when the device is CUDA.
            persistent_workers: keep the workers between epochs (needs ``num_workers`` >= 1).
            criterion: the loss; a new ``CrossEntropyLoss`` by default.
            device: where the model trains and evaluates.
            plugins: Avalanche plugins, after CoLoR's own (the list is copied, never changed);
                plugins that cannot act on CoLoR (replay, distillation, regularisation, LR
                schedulers) are refused with the reason.
            evaluator: Avalanche's ``EvaluationPlugin`` (or a factory of one).
            **kwargs: other keywords of Avalanche's ``SupervisedTemplate`` (``peval_mode``, ...).
        """
        # Every option above, by name: the fields of CoLoRConfig (tests/test_signatures.py).
        options = {name: value for name, value in locals().items() if name in CoLoRConfig.names()}
        options, kwargs = self.checked_options(model, config, options, plugins, kwargs)
        super().__init__(model=model, config=CoLoRConfig.build(config, **options), criterion=criterion,
                         device=device, plugins=plugins, evaluator=evaluator, template_options=kwargs)
