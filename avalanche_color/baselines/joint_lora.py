"""Joint-LoRA: one CoLoR expert trained on the whole stream at once, as CoLoR trains an expert (the
upper bound of a LoRA expert that sees every class together)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, Callable, Optional, Union

import torch
from avalanche.core import BasePlugin
from avalanche.training import JointTraining
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.plugins.evaluation import default_evaluator
from torch import Tensor, nn

from avalanche_color.baselines.options import JointLoRAOptions, plugin_list
from avalanche_color.color.model import ExpertViT
from avalanche_color.experts.routed_vit import check_vision_transformer
from avalanche_color.training.data_checks import check_training_experience
from avalanche_color.training.loaders import loader_options
from avalanche_color.training.strategy import (STRATEGY_KEYWORDS, StrategyBase, refuse_unknown_keywords,
                                               split_keywords)
from avalanche_color.utils.checks import require
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
    The options' defaults are CoLoR's (:class:`~avalanche_color.baselines.options.JointLoRAOptions`).
    """

    config_class = JointLoRAOptions
    config: JointLoRAOptions
    model: SingleLoRAExpert

    @classmethod
    def argument_docs(cls) -> dict[str, str]:
        return {
            "model": "a timm ``VisionTransformer``; a copy is adapted (the model given is not changed).",
            "device": STRATEGY_KEYWORDS["device"],
            "plugins": "Avalanche plugins, run after the data checks (the list is copied, never changed).",
            "evaluator": STRATEGY_KEYWORDS["evaluator"],
            "**kwargs": "other keywords of Avalanche's ``JointTraining`` (``eval_every``, ...).",
        }

    def __init__(self, model: nn.Module, *, config: Optional[JointLoRAOptions] = None,
                 device: Union[str, torch.device] = "cpu", plugins: Optional[Sequence[BasePlugin]] = None,
                 evaluator: Union[EvaluationPlugin, Callable[[], EvaluationPlugin]] = default_evaluator,
                 **options: Any) -> None:
        options, template_options = split_keywords(JointLoRAOptions, options)
        config = JointLoRAOptions.build(config, **options)
        refuse_unknown_keywords(type(self), JointLoRAOptions, template_options, JointTraining)
        require("plugins", plugins, plugin_list)
        check_vision_transformer(model)
        expert = SingleLoRAExpert(copy.deepcopy(model), config.rank, range(config.num_classes))
        optimizer = torch.optim.SGD([p for p in expert.parameters() if p.requires_grad], lr=config.lr,
                                    momentum=config.momentum, weight_decay=config.weight_decay)
        self.config = config
        # The data scan is done here, over every experience (the plugin would see the first alone).
        super().__init__(model=expert, optimizer=optimizer, criterion=nn.CrossEntropyLoss(),
                         train_mb_size=config.train_mb_size, train_epochs=config.train_epochs,
                         eval_mb_size=config.eval_mb_size, device=device, plugins=plugins, scan_experiences=False,
                         precision=config.precision, evaluator=evaluator, **template_options)

    def train_dataset_adaptation(self, **kwargs: Any) -> None:
        for experience in self._experiences:  # the head is fixed: labels it cannot hold fail mid-training
            largest = max(experience_classes(experience), default=-1)
            if largest >= self.config.num_classes:
                raise ValueError(f"num_classes={self.config.num_classes} cannot hold the labels of experience "
                                 f"{experience.current_experience}: its class ids go up to {largest}, so num_classes "
                                 f"must be at least {largest + 1}")
        if self.config.check_data:
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
