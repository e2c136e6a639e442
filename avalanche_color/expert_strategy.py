"""The training shared by the routed-expert strategies (CoLoR, S-Prompts).

One expert per training experience, trained alone with SGD and a cosine
schedule that restarts per experience; after each experience, k-means
prototypes for the router (:class:`~avalanche_color.PrototypeRouterPlugin`).
The strategies differ only in the model they build.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, Optional, TypeVar, Union

import torch
from avalanche.core import BasePlugin
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.plugins.evaluation import default_evaluator
from avalanche.training.templates import SupervisedTemplate
from torch import nn
from torch.optim import SGD
from torch.optim.lr_scheduler import CosineAnnealingLR

from avalanche_color.data_checks import DataChecksPlugin
from avalanche_color.distributed import eval_loader, gather_eval_batch, is_distributed, wrap_current_expert
from avalanche_color.experts import RoutedExpertViT
from avalanche_color.plugins import PROTOTYPE_DATA, PrototypeData, PrototypeRouterPlugin
from avalanche_color.validation import check_choice, check_positive, check_positive_int

Model = TypeVar("Model", bound=nn.Module)


class RoutedExpertsTemplate(SupervisedTemplate):
    """A :class:`RoutedExpertViT` trained expert by expert, with prototype routing.

    Args:
        model: the routed expert model.
        k: prototypes per experience.
        lr, momentum, weight_decay: SGD settings.
        kmeans_seed, kmeans_n_init: k-means ``random_state`` and restarts.
        prototype_data: embed the experience's data with its ``"train"`` or
            ``"eval"`` transforms for the prototypes.
        cache_evaluation: reuse routing features and frozen experts' outputs
            across evaluations (exact).
        check_data: scan each training experience for bad data before its
            expert exists (see :mod:`avalanche_color.data_checks`).
        criterion: loss; a new ``CrossEntropyLoss`` by default.
        train_mb_size, train_epochs, eval_mb_size, device, plugins, evaluator,
        eval_every: as in Avalanche's ``SupervisedTemplate``; ``plugins`` is
            copied, never changed.
    """

    model: RoutedExpertViT

    def __init__(
        self,
        *,
        model: RoutedExpertViT,
        k: int,
        lr: float,
        momentum: float,
        weight_decay: float,
        kmeans_seed: int,
        kmeans_n_init: int,
        prototype_data: PrototypeData,
        cache_evaluation: bool,
        check_data: bool,
        criterion: Optional[nn.Module],
        train_mb_size: int,
        train_epochs: int,
        eval_mb_size: int,
        device: Union[str, torch.device],
        plugins: Optional[Sequence[BasePlugin]],
        evaluator: Union[EvaluationPlugin, Callable[[], EvaluationPlugin]],
        eval_every: int,
        **base_kwargs: Any,
    ) -> None:
        if cache_evaluation:
            model.cache_evaluation()
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
        # Under torchrun: the model in DDP over the current expert, for training steps.
        self.ddp_model: Optional[nn.Module] = None
        router = PrototypeRouterPlugin(k, seed=kmeans_seed, n_init=kmeans_n_init, data=prototype_data)
        super().__init__(
            model=model,
            # Replaced by make_optimizer before each experience, once its expert exists.
            optimizer=SGD(model.parameters(), lr=lr),
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
        # First of all plugins: bad data is refused before anything acts on it.
        self.plugins.insert(0, DataChecksPlugin(scan_experiences=check_data))

    def check_model_and_optimizer(self, **kwargs: Any) -> None:
        # The optimiser holds only the new expert, so it is built after the
        # model adaptation that creates it, once per experience.
        self.model = self.model_adaptation()
        self.ddp_model = wrap_current_expert(self.model)
        self.make_optimizer(**kwargs)

    def forward(self) -> Any:
        if self.is_training and self.ddp_model is not None:
            return self.ddp_model(self.mb_x, self.mb_task_id)
        return super().forward()

    def make_eval_dataloader(self, num_workers: int = 0, **kwargs: Any) -> None:
        # Under torchrun each rank evaluates an unpadded shard (Avalanche's sampler pads).
        if is_distributed():
            self.dataloader = eval_loader(self.adapted_dataset, self.eval_mb_size, num_workers)
        else:
            super().make_eval_dataloader(num_workers=num_workers, **kwargs)

    def _after_eval_forward(self, **kwargs: Any) -> None:
        # First of all plugins: metrics then see the batches of all ranks.
        gather_eval_batch(self)
        super()._after_eval_forward(**kwargs)

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
            raise RuntimeError(
                f"{type(self).__name__} has no expert yet: call train() on an experience before eval()"
            )
        return super().eval(exp_list, **kwargs)


def expert_model(model: nn.Module, model_class: type[Model], **options: Any) -> Model:
    """``model`` wrapped as ``model_class`` with ``options`` (None: the class default),
    or ``model`` itself if it already is one (then no option may be given)."""
    if not isinstance(model, model_class):
        return model_class(model, **{name: value for name, value in options.items() if value is not None})
    conflicting = sorted(name for name, value in options.items() if value is not None)
    if conflicting:
        raise ValueError(
            f"model is already a configured {model_class.__name__} with its own settings; leave {conflicting} unset"
        )
    return model
