"""CoLoR as an Avalanche strategy: SupervisedTemplate + LoRA experts + prototype routing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, Optional, Union

import torch
from avalanche.core import BasePlugin
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.plugins.evaluation import default_evaluator
from torch import nn

from avalanche_color.expert_strategy import RoutedExpertsTemplate, expert_model
from avalanche_color.model import ExpertViT, Routing
from avalanche_color.plugins import PrototypeData
from avalanche_color.prototypes import Distance


class CoLoR(RoutedExpertsTemplate):
    """Continual Learning with Low Rank Adaptation (Wistuba et al., 2023).

    Each training experience gets its own expert (rank-r LoRA on q and v of
    every block of a frozen ViT, plus a linear head), trained with SGD and a
    cosine schedule that restarts per experience. After each experience,
    k-means over the experience's features gives k prototypes; at evaluation
    every sample goes to the expert of its nearest prototype.

    Defaults are the paper's (rank 64, batch 128, 50 epochs, lr 1e-3, weight
    decay 2e-4, SGD with momentum 0.9).

    Args:
        model: a timm ``VisionTransformer`` (adapted in place), or an
            :class:`ExpertViT` to continue from (then its own rank, alpha,
            routing and distance apply and those arguments must stay unset).
        rank: LoRA rank r (default 64).
        k: prototypes per experience (paper: 5 domain-, 20 class-incremental).
        alpha: LoRA alpha (default: rank, so the scaling is 1).
        routing: ``"backbone"`` (CoLoR), ``"first_expert"`` (CoLoR++) or
            ``"oracle"`` (route by task label: the task-incremental upper bound).
        distance: ``"euclidean"``, ``"l1"`` or ``"cosine"``.
        lr, momentum, weight_decay: SGD settings.
        kmeans_seed, kmeans_n_init: k-means ``random_state`` and restarts.
        prototype_data: embed the experience's data with its ``"train"`` or
            ``"eval"`` transforms for the prototypes.
        cache_evaluation: reuse routing features and frozen experts' outputs
            across evaluations (exact; pays off when the same test stream is
            evaluated after every experience with deterministic transforms).
        check_data: scan each training experience before training on it and
            refuse bad data (no samples, labels outside its classes, images the
            backbone cannot take, NaN/inf pixels) before its expert exists; a
            NaN/inf loss and NaN/inf evaluation pixels are refused either way
            (see :mod:`avalanche_color.data_checks`).
        criterion: loss; a new ``CrossEntropyLoss`` by default.
        train_mb_size, train_epochs, eval_mb_size, device, plugins, evaluator,
        eval_every: as in Avalanche's ``SupervisedTemplate``; ``plugins`` is
            copied, never changed.
    """

    model: ExpertViT

    def __init__(
        self,
        model: nn.Module,
        *,
        rank: Optional[int] = None,
        k: int = 5,
        alpha: Optional[float] = None,
        routing: Optional[Routing] = None,
        distance: Optional[Distance] = None,
        lr: float = 1e-3,
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
        # Training, optimiser, schedule and prototypes are shared with S-Prompts.
        super().__init__(
            model=expert_model(model, ExpertViT, rank=rank, alpha=alpha, routing=routing, distance=distance),
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


# Avalanche wraps every strategy's __init__ to warn about positional arguments.
# CoLoR(model, ...) is this package's documented call (everything else is
# keyword-only), so CoLoR keeps its own __init__; arguments are checked by Python.
CoLoR.__init__ = CoLoR.__init__.__wrapped__  # type: ignore[attr-defined]
