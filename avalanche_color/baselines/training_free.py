"""What the baselines that train nothing (NCM, RanPAC) share: the template whose epochs do nothing while a
plugin fits the classifier after each experience, the frozen copy of the ViT they use, and the features they
fit with (the frozen ViT's pooled features of an experience's training data, batch by batch)."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any, Callable, ClassVar

import torch
from avalanche.core import BasePlugin
from avalanche.training.templates import SupervisedTemplate
from torch import Tensor, nn

from avalanche_color.baselines.options import BaselineOptions
from avalanche_color.experts.routed_vit import check_vision_transformer
from avalanche_color.training.loaders import data_loader, loader_options
from avalanche_color.training.strategy import StrategyBase


def frozen_copy(model: nn.Module) -> nn.Module:
    """A frozen copy of ``model`` in eval mode, after checking it is a timm ViT (the one given is not changed)."""
    check_vision_transformer(model)
    return copy.deepcopy(model).requires_grad_(False).eval()


class TrainingFreeTemplate(StrategyBase):
    """A ``SupervisedTemplate`` whose epochs do nothing: no forward and no gradient step in training.

    A baseline on it (NCM, RanPAC) writes its ``__init__`` with its options (:attr:`config_class`, a
    :class:`~avalanche_color.baselines.options.BaselineOptions`), builds its model around the frozen copy of
    the ViT (:meth:`make_model`, with :func:`frozen_copy`) and gives the plugin that fits the model's classifier
    after each experience (:meth:`own_plugins`). The plugins run in this order: a
    :class:`~avalanche_color.DataChecksPlugin` (bad data is refused before anything changes), the fit, then the
    caller's ``plugins`` (the list is copied, never changed). The optimiser, which Avalanche's template requires,
    is an SGD with learning rate 0 that never steps; the criterion (cross-entropy) only gives Avalanche's loss
    metrics a value at evaluation.
    """

    config_class: ClassVar[type[BaselineOptions]]
    config: BaselineOptions
    optimizer_description = "none: nothing trains"
    optimizer_options = ()

    def make_model(self, model: nn.Module) -> nn.Module:
        """The baseline's model around :func:`frozen_copy` of ``model``, with the options of :attr:`config`."""
        raise NotImplementedError

    def template_settings(self, model: nn.Module) -> dict[str, Any]:
        return dict(optimizer=torch.optim.SGD(model.parameters(), lr=0.0), train_mb_size=self.config.train_mb_size,
                    eval_mb_size=self.config.eval_mb_size)

    def own_plugins(self) -> list[BasePlugin]:
        """The plugin that fits the model's classifier after each experience (after the data checks, before the
        user's plugins)."""
        raise NotImplementedError

    def check_model_and_optimizer(self, **kwargs: Any) -> None:
        # Nothing trains: the model adapts to the experience (its classifier covers the classes), and the
        # optimiser, which never steps, is not made again.
        self.model = self.model_adaptation()

    def training_epoch(self, **kwargs: Any) -> None:
        pass


def pooled_features(vit: nn.Module, x: Tensor) -> Tensor:
    """The timm ViT's pooled features before its head, (batch, num_features): what ``vit(x)`` gives
    for a headless ViT (``num_classes=0``), and the same for a ViT with a classifier head."""
    return vit.forward_head(vit.forward_features(x), pre_logits=True)


@torch.no_grad()
def experience_features(strategy: SupervisedTemplate, extract: Callable[[Tensor], Tensor],
                        call_options: Mapping[str, Any]) -> Iterator[tuple[Tensor, Tensor]]:
    """``(extract(x), y)`` for each batch of the current experience's data with its eval transforms,
    in order, with the model in eval mode (its mode is restored afterwards). ``call_options``: the
    keywords of the ``train`` call (a plugin callback's ``kwargs``), whose loader options
    (``num_workers``, ...) this loader takes."""
    model = strategy.model
    training = model.training
    model.eval()
    try:
        loader = data_loader(strategy.experience.dataset.eval(), loader_options(call_options), strategy.device,
                             batch_size=strategy.train_mb_size, shuffle=False)
        for x, y, *_ in loader:
            features = extract(x.to(strategy.device))
            yield features, y.to(features.device)
    finally:
        model.train(training)
