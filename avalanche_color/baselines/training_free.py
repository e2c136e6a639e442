"""The template of the baselines that train nothing (NCM, RanPAC): the epochs do nothing, a plugin fits
the classifier after each experience."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, Callable, Optional, Union

import torch
from avalanche.core import BasePlugin
from avalanche.training.plugins import EvaluationPlugin
from torch import nn

from avalanche_color.experts.backbone import check_vision_transformer
from avalanche_color.training.strategy_base import StrategyBase
from avalanche_color.utils.checks import boolean, positive_int, require


def frozen_copy(model: nn.Module) -> nn.Module:
    """A frozen copy of ``model`` in eval mode, after checking it is a timm ViT (the one given is not changed)."""
    check_vision_transformer(model)
    return copy.deepcopy(model).requires_grad_(False).eval()


class TrainingFreeTemplate(StrategyBase):
    """A ``SupervisedTemplate`` whose epochs do nothing: no forward and no gradient step in training.

    ``fit`` (a plugin) fits the model's classifier after each experience. The plugins run in this
    order: a :class:`~avalanche_color.DataChecksPlugin` (bad data is refused before anything
    changes), ``fit``, then the caller's ``plugins`` (the list is copied, never changed). The
    optimiser, which Avalanche's template requires, is an SGD with learning rate 0 that never steps;
    the criterion (cross-entropy) only gives Avalanche's loss metrics a value at evaluation.
    """

    def __init__(self, model: nn.Module, *, fit: BasePlugin, check_data: bool, train_mb_size: int,
                 eval_mb_size: int, device: Union[str, torch.device], plugins: Optional[Sequence[BasePlugin]],
                 evaluator: Union[EvaluationPlugin, Callable[[], EvaluationPlugin]], **kwargs: Any) -> None:
        require("check_data", check_data, boolean)
        require("train_mb_size", train_mb_size, positive_int)
        require("eval_mb_size", eval_mb_size, positive_int)
        if plugins is not None and not isinstance(plugins, Sequence):
            raise ValueError(f"plugins must be a sequence of Avalanche plugins or None, got {plugins!r}")
        super().__init__(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
                         criterion=nn.CrossEntropyLoss(), train_mb_size=train_mb_size, eval_mb_size=eval_mb_size,
                         device=device, plugins=plugins, scan_experiences=check_data, own_plugins=[fit],
                         evaluator=evaluator, **kwargs)

    def training_epoch(self, **kwargs: Any) -> None:
        pass
