"""S-Prompts as an Avalanche strategy: CoLoR's training and routing with prompt-token experts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, Optional, Union

import torch
from avalanche.core import BasePlugin
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.plugins.evaluation import default_evaluator
from torch import nn

from avalanche_color.experts import Routing
from avalanche_color.expert_strategy import RoutedExpertsTemplate, expert_model
from avalanche_color.plugins import PrototypeData
from avalanche_color.prompt_experts import PromptExpertViT
from avalanche_color.prototypes import Distance


class SPrompts(RoutedExpertsTemplate):
    """S-Prompts (Wang et al., NeurIPS 2022), image-prompt variant (S-iPrompts), on any timm ViT.

    Each training experience gets its own expert: ``prompt_length`` learnable
    tokens inserted behind the [CLS] token of a frozen ViT, plus a linear head
    on the [CLS] feature. Everything else is CoLoR's, from the same code: SGD
    with a cosine schedule restarting per experience, k-means prototypes of the
    frozen backbone's features after each experience, nearest-prototype routing
    per sample at evaluation (S-Prompts' own code used L1 distance; pass
    ``distance="l1"`` for that).

    Defaults: prompt length 10, lr 0.01, SGD momentum 0.9, weight decay 2e-4,
    batch 128 (S-Prompts' published configs); k 5 (S-Prompts' and the CoLoR
    paper's choice for domain-incremental streams); 50 epochs like CoLoR.

    Args:
        model: a timm ``VisionTransformer`` (frozen, not changed), or a
            :class:`PromptExpertViT` to continue from (then ``prompt_length``,
            ``routing`` and ``distance`` must stay unset).
        prompt_length: prompt tokens per expert (default 10).
        k: prototypes per experience.
        routing: ``"backbone"`` (S-Prompts), ``"first_expert"`` (route with the
            first expert's prompts, as CoLoR++) or ``"oracle"`` (task labels).
        distance: ``"euclidean"`` (default), ``"l1"`` or ``"cosine"``.
        lr, momentum, weight_decay: SGD settings.
        kmeans_seed, kmeans_n_init, prototype_data, cache_evaluation, check_data, criterion,
        train_mb_size, train_epochs, eval_mb_size, device, plugins, evaluator,
        eval_every: as in :class:`~avalanche_color.CoLoR`.
    """

    model: PromptExpertViT

    def __init__(
        self,
        model: nn.Module,
        *,
        prompt_length: Optional[int] = None,
        k: int = 5,
        routing: Optional[Routing] = None,
        distance: Optional[Distance] = None,
        lr: float = 0.01,
        momentum: float = 0.9,
        weight_decay: float = 2e-4,
        kmeans_seed: int = 0,
        kmeans_n_init: int = 10,
        prototype_data: PrototypeData = "train",
        cache_evaluation: bool = False,
        check_data: bool = True,
        criterion: Optional[nn.Module] = None,
        train_mb_size: int = 128,
        train_epochs: int = 50,
        eval_mb_size: int = 128,
        device: Union[str, torch.device] = "cpu",
        plugins: Optional[Sequence[BasePlugin]] = None,
        evaluator: Union[EvaluationPlugin, Callable[[], EvaluationPlugin]] = default_evaluator,
        eval_every: int = -1,
        **base_kwargs: Any,
    ) -> None:
        super().__init__(
            model=expert_model(model, PromptExpertViT, prompt_length=prompt_length, routing=routing,
                               distance=distance),
            k=k,
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            kmeans_seed=kmeans_seed,
            kmeans_n_init=kmeans_n_init,
            prototype_data=prototype_data,
            cache_evaluation=cache_evaluation,
            check_data=check_data,
            criterion=criterion,
            train_mb_size=train_mb_size,
            train_epochs=train_epochs,
            eval_mb_size=eval_mb_size,
            device=device,
            plugins=plugins,
            evaluator=evaluator,
            eval_every=eval_every,
            **base_kwargs,
        )


# As for CoLoR: the model is the one positional argument, so skip Avalanche's positional-argument wrapper.
SPrompts.__init__ = SPrompts.__init__.__wrapped__  # type: ignore[attr-defined]
