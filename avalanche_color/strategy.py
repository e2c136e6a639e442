"""CoLoR as an Avalanche strategy: SupervisedTemplate + LoRA experts + prototype routing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, Optional, Union

import torch
from avalanche.core import BasePlugin
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.plugins.evaluation import default_evaluator
from avalanche.training.templates import SupervisedTemplate
from torch import nn
from torch.optim import SGD
from torch.optim.lr_scheduler import CosineAnnealingLR

from avalanche_color.model import ExpertViT, Routing
from avalanche_color.plugins import PROTOTYPE_DATA, PrototypeData, PrototypeRouterPlugin
from avalanche_color.prototypes import Distance
from avalanche_color.validation import check_choice, check_positive, check_positive_int


class CoLoR(SupervisedTemplate):
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
        expert_model = _expert_model(model, rank=rank, alpha=alpha, routing=routing, distance=distance)
        if cache_evaluation:
            expert_model.cache_evaluation()
        check_choice("prototype_data", prototype_data, PROTOTYPE_DATA)
        check_positive("lr", lr)
        if momentum < 0:
            raise ValueError(f"momentum must be >= 0, got {momentum!r}")
        if weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}")
        for name, value in (("train_mb_size", train_mb_size), ("train_epochs", train_epochs),
                            ("eval_mb_size", eval_mb_size)):
            check_positive_int(name, value)
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.lr_scheduler: Optional[CosineAnnealingLR] = None
        router = PrototypeRouterPlugin(k, seed=kmeans_seed, n_init=kmeans_n_init, data=prototype_data)
        super().__init__(
            model=expert_model,
            # Replaced by make_optimizer before each experience, once its expert exists.
            optimizer=SGD(expert_model.parameters(), lr=lr),
            criterion=nn.CrossEntropyLoss() if criterion is None else criterion,
            train_mb_size=train_mb_size,
            train_epochs=train_epochs,
            eval_mb_size=eval_mb_size,
            device=device,
            plugins=[router, *(plugins or ())],
            evaluator=evaluator,
            eval_every=eval_every,
            **base_kwargs,
        )

    def check_model_and_optimizer(self, **kwargs: Any) -> None:
        # The optimiser holds only the new expert, so it is built after the
        # model adaptation that creates it, once per experience.
        self.model = self.model_adaptation()
        self.make_optimizer(**kwargs)

    def make_optimizer(self, **kwargs: Any) -> None:
        """A fresh SGD over the current expert only, with a cosine schedule over the experience."""
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = SGD(trainable, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)
        steps = self.train_epochs * max(len(self.dataloader), 1)
        self.lr_scheduler = CosineAnnealingLR(self.optimizer, T_max=steps)

    def optimizer_step(self) -> None:
        super().optimizer_step()
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()

    def eval(self, exp_list: Any, **kwargs: Any) -> Any:
        if self.model.num_experts == 0:
            raise RuntimeError("CoLoR has no expert yet: call train() on an experience before eval()")
        return super().eval(exp_list, **kwargs)


# Avalanche wraps every strategy's __init__ to warn about positional arguments.
# CoLoR(model, ...) is this package's documented call (everything else is
# keyword-only), so CoLoR keeps its own __init__; arguments are checked by Python.
CoLoR.__init__ = CoLoR.__init__.__wrapped__  # type: ignore[attr-defined]


def _expert_model(
    model: nn.Module,
    *,
    rank: Optional[int],
    alpha: Optional[float],
    routing: Optional[Routing],
    distance: Optional[Distance],
) -> ExpertViT:
    if not isinstance(model, ExpertViT):
        return ExpertViT(
            model,
            rank=64 if rank is None else rank,
            alpha=alpha,
            routing=routing or "backbone",
            distance=distance or "euclidean",
        )
    given = {"rank": rank, "alpha": alpha, "routing": routing, "distance": distance}
    conflicting = {name: value for name, value in given.items() if value is not None}
    if conflicting:
        raise ValueError(
            f"model is already an ExpertViT with its own settings; leave {sorted(conflicting)} unset"
        )
    return model
