"""RanPAC (McDonnell et al., "RanPAC: Random Projections and Pre-trained Models for Continual
Learning", NeurIPS 2023) on a frozen timm ViT: nothing trains.

The backbone's pooled features (not normalised, as RanPAC uses them) go through a fixed
random projection with ReLU, M wide (``width``; RanPAC uses 10,000 for ViT-B/16, the default
here is smaller: :class:`~avalanche_color.baselines.options.RanPACOptions` says why);
a ridge readout onto the classes is solved in closed form from the accumulated Gram
matrix after each experience, λ chosen on a held-out 20% of that experience
(:class:`~avalanche_color.RandomFeatureRidge`). RanPAC's first-session
adaptation of the backbone is left out: like NCM, nothing trains.
"""

from collections.abc import Sequence
from typing import Any, Optional, Union

import torch
from avalanche.core import BasePlugin, SupervisedPlugin
from avalanche.models import DynamicModule
from avalanche.training.plugins.evaluation import default_evaluator
from avalanche.training.templates import SupervisedTemplate
from torch import Tensor, nn

from avalanche_color.baselines.options import RanPACOptions
from avalanche_color.baselines.training_free import (TrainingFreeTemplate, experience_features, frozen_copy,
                                                     pooled_features)
from avalanche_color.routing.classifiers import RandomFeatureRidge
from avalanche_color.training.strategy import Evaluator
from avalanche_color.utils.experiences import experience_classes


class RanPACModel(DynamicModule):
    """A frozen timm ViT and a closed-form ridge readout over random ReLU features of its pooled features.

    Its scores cover every class id up to the largest of any experience it has been adapted to
    (Avalanche adapts the model to each training and evaluation experience) or fitted on; a
    class with no training sample yet scores ``-inf``.

    Args:
        vit: a timm ``VisionTransformer``, used as it is (frozen and kept in eval mode).
        width, seed: the random features M and the projection's seed, as :class:`RanPACOptions` declares them.
    """

    def __init__(self, vit: nn.Module, width: int, seed: int) -> None:
        super().__init__()
        self.backbone = vit.requires_grad_(False).eval()
        self.num_classes = 0  # the classes the scores cover, grown by adaptation (and by the fits)
        self.ridge = RandomFeatureRidge(vit.num_features, width, seed=seed)

    def features(self, x: Tensor) -> Tensor:
        """The backbone's pooled features, (batch, num_features)."""
        return pooled_features(self.backbone, x)

    def forward(self, x: Tensor) -> Tensor:
        features = self.features(x)
        scores = features.new_full((x.shape[0], max(self.num_classes, self.ridge.num_targets)), float("-inf"))
        if self.ridge.num_targets:
            seen = self.ridge.moments.any(dim=0)  # a class with no sample keeps -inf
            fitted = self.ridge(features)
            scores[:, : self.ridge.num_targets] = fitted.masked_fill(~seen, float("-inf"))
        return scores

    def adaptation(self, experience: Any) -> None:
        classes = experience_classes(experience)
        if classes:
            self.num_classes = max(self.num_classes, max(classes) + 1)

    def train(self, mode: bool = True) -> "RanPACModel":
        super().train(mode)
        self.backbone.eval()
        return self


class RidgeUpdate(SupervisedPlugin):
    """After each experience: its features (eval transforms) added to the ridge, the readout solved again."""

    def after_training_exp(self, strategy: SupervisedTemplate, **kwargs: Any) -> None:
        model: RanPACModel = strategy.model
        features, labels = zip(*experience_features(strategy, model.features, kwargs))
        model.ridge.fit(torch.cat(features), torch.cat(labels), keep=True)


class RanPAC(TrainingFreeTemplate):
    """RanPAC (McDonnell et al., NeurIPS 2023) on a frozen timm ViT, as an Avalanche strategy.

    Nothing trains: the epochs do nothing. After each training experience its pooled features
    (the data set's eval transforms) are expanded by a fixed random projection with ReLU
    (``width`` = M features) and added to the accumulated Gram matrix, and a ridge readout onto
    one-hot class targets is solved in closed form, λ chosen on a held-out 20% of that
    experience (:class:`~avalanche_color.RandomFeatureRidge`). The result does not depend on
    the order of the data. A class with no training sample yet scores ``-inf``; the scores grow
    with the class ids seen, so no class count is given. RanPAC's first-session adaptation of
    the backbone is left out.
    """

    config_class = RanPACOptions
    config: RanPACOptions
    model: RanPACModel

    def __init__(
        self,
        model: nn.Module,
        config: Optional[RanPACOptions] = None,
        *,
        width: int = RanPACOptions.width,
        seed: int = RanPACOptions.seed,
        # BaselineOptions
        check_data: bool = RanPACOptions.check_data,
        train_mb_size: int = RanPACOptions.train_mb_size,
        eval_mb_size: int = RanPACOptions.eval_mb_size,
        # Avalanche's (StrategyBase)
        device: Union[str, torch.device] = "cpu",
        plugins: Optional[Sequence[BasePlugin]] = None,
        evaluator: Evaluator = default_evaluator,
        **template_options: Any,
    ) -> None:
        """RanPAC on ``model``, with the options of ``config`` and those given here; the others keep their defaults.

        Each option (``width`` to ``eval_mb_size``) is a field of
        :class:`~avalanche_color.baselines.options.RanPACOptions`, documented there; its default is the config's.
        ``device``, ``plugins``, ``evaluator`` and Avalanche's other keywords: as
        :class:`~avalanche_color.training.strategy.StrategyBase` says.

        Args:
            model: a timm ``VisionTransformer``; a frozen copy is used (the model given is not changed), its pooled
                features before any classifier head.
            config: all options as one :class:`~avalanche_color.baselines.options.RanPACOptions`; an option given
                here replaces its field.
        """
        options = dict(
            width=width, seed=seed, check_data=check_data, train_mb_size=train_mb_size, eval_mb_size=eval_mb_size)
        super().__init__(model=model, config=config, options=options, device=device, plugins=plugins,
                         evaluator=evaluator, template_options=template_options)

    def make_model(self, model: nn.Module) -> RanPACModel:
        return RanPACModel(frozen_copy(model), self.config.width, self.config.seed)

    def own_plugins(self) -> list[BasePlugin]:
        return [RidgeUpdate()]
