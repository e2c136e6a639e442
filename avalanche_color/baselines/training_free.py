"""The template of the baselines that train nothing (NCM, RanPAC): the epochs do nothing, a plugin fits
the classifier after each experience."""

from __future__ import annotations

import copy
from typing import Any, Callable, Union

import torch
from avalanche.core import BasePlugin
from avalanche.training.plugins import EvaluationPlugin
from torch import nn

from avalanche_color.baselines.options import BaselineOptions
from avalanche_color.experts.routed_vit import check_vision_transformer
from avalanche_color.training.strategy import StrategyBase


def frozen_copy(model: nn.Module) -> nn.Module:
    """A frozen copy of ``model`` in eval mode, after checking it is a timm ViT (the one given is not changed)."""
    check_vision_transformer(model)
    return copy.deepcopy(model).requires_grad_(False).eval()


class TrainingFreeTemplate(StrategyBase):
    """A ``SupervisedTemplate`` whose epochs do nothing: no forward and no gradient step in training.

    ``fit`` (a plugin) fits the model's classifier after each experience. The plugins run in this
    order: a :class:`~avalanche_color.DataChecksPlugin` (bad data is refused before anything
    changes), ``fit``, then the caller's ``options.plugins`` (the list is copied, never changed). The
    optimiser, which Avalanche's template requires, is an SGD with learning rate 0 that never steps;
    the criterion (cross-entropy) only gives Avalanche's loss metrics a value at evaluation.
    """

    def __init__(self, model: nn.Module, *, fit: BasePlugin, options: BaselineOptions,
                 device: Union[str, torch.device], evaluator: Union[EvaluationPlugin, Callable[[], EvaluationPlugin]],
                 **kwargs: Any) -> None:
        super().__init__(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
                         criterion=nn.CrossEntropyLoss(), train_mb_size=options.train_mb_size,
                         eval_mb_size=options.eval_mb_size, device=device, plugins=options.plugins,
                         scan_experiences=options.check_data, own_plugins=[fit], evaluator=evaluator, **kwargs)

    def training_epoch(self, **kwargs: Any) -> None:
        pass
