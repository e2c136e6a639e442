"""S-Prompts as an Avalanche strategy: CoLoR's training and routing with prompt-token experts."""

# No `from __future__ import annotations`: help() and inspect.signature show the evaluated types.
from collections.abc import Sequence
from typing import Any, Callable, ClassVar, Optional, Union

import torch
from avalanche.core import BasePlugin
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.plugins.evaluation import default_evaluator
from torch import nn

from avalanche_color.config import Distance, Precision, PrototypeData, Router, RoutingFeatures
from avalanche_color.peers.s_prompts.config import PromptOptions, Schedule, SPromptsConfig
from avalanche_color.peers.s_prompts.model import PromptExpertViT
from avalanche_color.training.strategy import RoutedExpertsTemplate


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
    domain-incremental streams); 50 epochs like CoLoR. Every option is a field of
    :class:`~avalanche_color.peers.s_prompts.config.SPromptsConfig` with the same default.
    """

    model: PromptExpertViT
    config: SPromptsConfig
    config_class: ClassVar[type[SPromptsConfig]] = SPromptsConfig
    model_class: ClassVar[type[PromptExpertViT]] = PromptExpertViT
    model_config_class: ClassVar[type[PromptOptions]] = PromptOptions

    def __init__(
        self,
        model: nn.Module,
        *,
        config: Optional[SPromptsConfig] = None,
        prompt_length: int = 10,
        routing_features: RoutingFeatures = "backbone",
        router: Router = "prototypes",
        router_width: int = 2048,
        distance: Distance = "l1",
        normalize_features: bool = True,
        cache_evaluation: bool = False,
        cache_evaluation_bytes: int = 1073741824,
        k: int = 5,
        kmeans_seed: int = 0,
        kmeans_n_init: int = 10,
        prototype_data: PrototypeData = "train",
        prototype_batch_size: Optional[int] = None,
        prototypes_per_class: Optional[int] = None,
        lr: float = 0.01,
        momentum: float = 0.9,
        weight_decay: float = 2e-4,
        lr_schedule: Schedule = "cosine",
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
            model: a timm ``VisionTransformer`` (frozen, not changed), or a
                :class:`~avalanche_color.PromptExpertViT` to continue from: then its own options
                (``prompt_length`` and the routing options) apply, and giving one a value other
                than its default and the model's is refused.
            config: all options as one :class:`~avalanche_color.peers.s_prompts.config.SPromptsConfig`;
                options given beside it with a value other than their default replace its fields.
            prompt_length: prompt tokens per expert (S-Prompts: 10); at least 1.
            routing_features: where the features that prototypes are made of and samples are
                routed by come from: ``"backbone"``, the frozen ViT (S-Prompts), or
                ``"first_expert"``, the ViT with the first expert's prompts.
            router: what picks each sample's expert: ``"prototypes"``, the nearest k-means
                prototype (S-Prompts); ``"oracle"``, the expert of the sample's task label;
                ``"ridge"`` or ``"gaussian"``, class-level routers over (expert, class) pairs.
            router_width: the ridge router's random features M (its statistics: M² float64 numbers).
            distance: between features and prototypes: ``"l1"`` (S-Prompts' code), ``"euclidean"``
                (CoLoR's) or ``"cosine"``.
            normalize_features: L2-normalise features before clustering and routing.
            cache_evaluation: reuse routing features and frozen experts' outputs across
                evaluations (exact with deterministic transforms).
            cache_evaluation_bytes: the most host memory the evaluation cache takes (default 1 GiB: the
                routing features of about 170,000 images of a ViT-B/16); the oldest entries go first.
            k: prototypes per experience (S-Prompts: 5).
            kmeans_seed: k-means ``random_state``.
            kmeans_n_init: k-means restarts (explicit: scikit-learn's default changed in 1.4).
            prototype_data: embed each experience with its ``"train"`` transforms (as the loader
                gives it, S-Prompts' choice) or its ``"eval"`` transforms.
            prototype_batch_size: batch size of the embedding pass; None: ``eval_mb_size``.
            prototypes_per_class: this many k-means centres within each class of the experience
                instead of ``k`` over the whole experience; None: off.
            lr: SGD's learning rate, cosine-annealed over each experience (as ``lr_schedule``).
            momentum: SGD's momentum.
            weight_decay: SGD's weight decay.
            lr_schedule: ``"cosine"``: annealed to zero over each experience's steps, stepping after every
                optimiser step (CoLoR's); ``"epoch_cosine"``: as S-Prompts' code, ``CosineAnnealingLR(T_max=epochs)``
                stepped after each epoch: epoch e of E at ``lr (1 + cos(pi e / E)) / 2``, the first at lr, the
                last above zero (9.5% of lr for 5 epochs).
            train_mb_size: training mini-batch size.
            train_epochs: epochs per experience.
            eval_mb_size: evaluation mini-batch size.
            eval_every: Avalanche's periodic evaluation during training: every that many epochs
                (or iterations, with ``peval_mode="iteration"``); 0: at the end of each experience
                only; -1: never.
            precision: ``"32-true"`` (float32); ``"bf16-mixed"`` or ``"16-mixed"``: each forward and its loss
                under bfloat16 or float16 autocast, the trained weights kept float32 (float16 with a gradient
                scaler; see :class:`~avalanche_color.training.strategy.MixedPrecision`). A ViT given in bfloat16 stays so
                (half its memory); the prompts and heads are float32 beside it all the same.
            check_data: scan each training experience for bad data before its expert exists.
            num_workers: DataLoader worker processes of every loader (0: in this process).
            pin_memory: page-locked batches; None: when the device is CUDA.
            persistent_workers: keep the workers between epochs (needs ``num_workers`` >= 1).
            criterion: the loss; a new ``CrossEntropyLoss`` by default.
            device: where the model trains and evaluates.
            plugins: Avalanche plugins, after the strategy's own (the list is copied, never
                changed); plugins that cannot act on it are refused with the reason.
            evaluator: Avalanche's ``EvaluationPlugin`` (or a factory of one).
            **kwargs: other keywords of Avalanche's ``SupervisedTemplate`` (``peval_mode``, ...).
        """
        # Every option above, by name: the fields of SPromptsConfig (tests/test_signatures.py).
        options = {name: value for name, value in locals().items() if name in SPromptsConfig.names()}
        options, kwargs = self.checked_options(model, config, options, plugins, kwargs)
        super().__init__(model=model, config=SPromptsConfig.build(config, **options), criterion=criterion,
                         device=device, plugins=plugins, evaluator=evaluator, template_options=kwargs)

    def restart_schedule(self) -> None:
        """As ``lr_schedule``: the template's cosine per step, or S-Prompts' code's cosine per epoch."""
        if self.config.lr_schedule == "epoch_cosine":
            return self.restart_cosine_per_epoch()
        super().restart_schedule()
