"""Joint-LoRA: one CoLoR expert trained on the whole stream at once, as CoLoR trains an expert (the
upper bound of a LoRA expert that sees every class together)."""

# No `from __future__ import annotations`: help() and inspect.signature show the evaluated types.
import copy
from collections.abc import Sequence
from typing import Any, Callable, Optional, Union

import torch
from avalanche.core import BasePlugin
from avalanche.training import JointTraining
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.plugins.evaluation import default_evaluator
from torch import Tensor, nn

from avalanche_color.baselines.options import BaselineOptions
from avalanche_color.color.model import ExpertViT
from avalanche_color.experts.routed_vit import check_vision_transformer
from avalanche_color.training.data_checks import check_training_experience
from avalanche_color.training.loaders import loader_options
from avalanche_color.training.strategy import StrategyBase
from avalanche_color.utils.checks import non_negative, positive, positive_int, require
from avalanche_color.utils.experiences import experience_classes


class SingleLoRAExpert(nn.Module):
    """Joint-LoRA's model: CoLoR's :class:`~avalanche_color.ExpertViT` with a single expert, its head over
    ``classes``.

    One CoLoR expert (rank-r LoRA on q and v of every block of the frozen ViT) trained on the
    whole stream; with one expert there is nothing to route, so it always predicts.
    """

    def __init__(self, vit: nn.Module, rank: int, classes: Sequence[int]) -> None:
        super().__init__()
        self.experts = ExpertViT(vit, rank=rank)
        self.experts.start_expert(list(classes), experience=0)

    @property
    def backbone(self) -> nn.Module:
        """The ViT (with its LoRA layers), whose patch embedding says which images it takes."""
        return self.experts.backbone

    def forward(self, x: Tensor) -> Tensor:
        return self.experts.predict(x, 0)


class JointLoRA(StrategyBase, JointTraining):
    """Joint-LoRA: Avalanche's ``JointTraining`` of one CoLoR expert on all experiences at once.

    The expert is rank-``rank`` LoRA on the query and value projections of every block of a frozen
    copy of the ViT, with a linear head over class ids ``0 .. num_classes - 1``
    (:class:`SingleLoRAExpert`); it trains as CoLoR trains an expert: SGD over the expert's
    parameters only, with momentum and weight decay, the learning rate annealed to zero by a cosine
    over all steps. ``train`` is called once, with the whole stream (Avalanche's ``JointTraining``).
    An upper bound for CoLoR: one expert that sees every class together, with nothing to route.

    The defaults are CoLoR's (:class:`~avalanche_color.CoLoRConfig`: the CoLoR paper's rank 64,
    lr 1e-3, momentum 0.9, weight decay 2e-4, batch 128, 50 epochs).
    """

    model: SingleLoRAExpert

    def __init__(
        self,
        model: nn.Module,
        *,
        num_classes: int,
        rank: int = 64,
        lr: float = 1e-3,
        momentum: float = 0.9,
        weight_decay: float = 2e-4,
        check_data: bool = True,
        train_mb_size: int = 128,
        train_epochs: int = 50,
        eval_mb_size: int = 128,
        device: Union[str, torch.device] = "cpu",
        plugins: Optional[Sequence[BasePlugin]] = None,
        evaluator: Union[EvaluationPlugin, Callable[[], EvaluationPlugin]] = default_evaluator,
        **kwargs: Any,
    ) -> None:
        """
        Args:
            model: a timm ``VisionTransformer``; a copy is adapted (the model given is not changed).
            num_classes: the head's classes, ids ``0 .. num_classes - 1`` (every class of the stream:
                the head exists before the one training on all of them).
            rank: LoRA rank r.
            lr: SGD's learning rate at the first step (cosine-annealed to zero).
            momentum: SGD's momentum.
            weight_decay: SGD's weight decay.
            check_data: scan every training experience for bad samples (non-finite pixels, labels that
                are not class ids, images the ViT cannot take) before training
                (:class:`~avalanche_color.DataChecksPlugin` checks the loss either way).
            train_mb_size: training mini-batch size.
            train_epochs: epochs over the whole stream.
            eval_mb_size: evaluation mini-batch size.
            device: where the model trains and evaluates.
            plugins: Avalanche plugins, run after the data checks (the list is copied, never changed).
            evaluator: Avalanche's ``EvaluationPlugin`` (or a factory of one).
            **kwargs: other keywords of Avalanche's ``JointTraining`` (``eval_every``, ...).
        """
        check_vision_transformer(model)
        require("num_classes", num_classes, positive_int)
        require("rank", rank, positive_int)
        require("lr", lr, positive)
        require("momentum", momentum, non_negative)
        require("weight_decay", weight_decay, non_negative)
        options = BaselineOptions(check_data=check_data, train_mb_size=train_mb_size, eval_mb_size=eval_mb_size,
                                  plugins=plugins)
        expert = SingleLoRAExpert(copy.deepcopy(model), rank, range(num_classes))
        optimizer = torch.optim.SGD([p for p in expert.parameters() if p.requires_grad], lr=lr, momentum=momentum,
                                    weight_decay=weight_decay)
        self.check_data = options.check_data
        self.num_classes = num_classes
        # The data scan is done here, over every experience (the plugin would see the first alone).
        super().__init__(model=expert, optimizer=optimizer, criterion=nn.CrossEntropyLoss(),
                         train_mb_size=options.train_mb_size, train_epochs=train_epochs,
                         eval_mb_size=options.eval_mb_size, device=device, plugins=options.plugins,
                         scan_experiences=False, evaluator=evaluator, **kwargs)

    def train_dataset_adaptation(self, **kwargs: Any) -> None:
        for experience in self._experiences:  # the head is fixed: labels it cannot hold fail mid-training
            largest = max(experience_classes(experience), default=-1)
            if largest >= self.num_classes:
                raise ValueError(f"num_classes={self.num_classes} cannot hold the labels of experience "
                                 f"{experience.current_experience}: its class ids go up to {largest}, so num_classes "
                                 f"must be at least {largest + 1}")
        if self.check_data:
            for experience in self._experiences:
                check_training_experience(experience, self.model.backbone, self.eval_mb_size or self.train_mb_size,
                                          loader_options(kwargs).num_workers)
        super().train_dataset_adaptation(**kwargs)

    def model_adaptation(self, model: Optional[nn.Module] = None) -> nn.Module:
        # The model is complete before training: JointTraining adapts every dynamic module to every
        # experience, which would give the ExpertViT one more expert per experience.
        return (self.model if model is None else model).to(self.device)

    def make_optimizer(self, **kwargs: Any) -> None:
        self.restart_cosine()
