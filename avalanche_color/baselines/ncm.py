"""NCM (SimpleCIL: Zhou et al., "Revisiting Class-Incremental Learning with Pre-Trained Models:
Generalizability and Adaptivity are All You Need", IJCV 2024) on a frozen timm ViT: each class is the
mean of its samples' L2-normalised pooled features, a sample goes to the nearest mean. Nothing trains."""

from collections.abc import Sequence
from typing import Any, Optional, Union

import torch
from avalanche.core import BasePlugin, SupervisedPlugin
from avalanche.models import NCMClassifier
from avalanche.training.plugins.evaluation import default_evaluator
from avalanche.training.templates import SupervisedTemplate
from torch import Tensor, nn

from avalanche_color.baselines.options import BaselineOptions
from avalanche_color.baselines.training_free import (TrainingFreeTemplate, experience_features, frozen_copy,
                                                     pooled_features)
from avalanche_color.training.strategy import Evaluator


class SeenClassesNCM(NCMClassifier):
    """Avalanche's ``NCMClassifier``, with ``-inf`` for classes that have no mean yet.

    It stores a zero mean for a class id below the largest seen that has none (a class of a
    later experience, in a class-incremental stream); a zero mean is at distance 1 from every
    L2-normalised feature, nearer than a real class mean whose cosine with the feature is below 0.5.
    """

    def forward(self, x: Tensor) -> Tensor:
        scores = super().forward(x)
        return scores.masked_fill(~self.class_means.to(x.device).any(dim=1), float("-inf"))


class NCMModel(nn.Module):
    """A frozen timm ViT and a :class:`SeenClassesNCM` over its pooled features (normalised).

    The classifier is an Avalanche ``DynamicModule``: adapted to an evaluation experience, it
    covers that experience's class ids too (those without a mean score ``-inf``).
    """

    def __init__(self, vit: nn.Module) -> None:
        super().__init__()
        self.backbone = vit.requires_grad_(False).eval()
        self.classifier = SeenClassesNCM(normalize=True)

    def features(self, x: Tensor) -> Tensor:
        """The backbone's pooled features, (batch, num_features), not normalised."""
        return pooled_features(self.backbone, x)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))

    def train(self, mode: bool = True) -> "NCMModel":
        super().train(mode)
        self.backbone.eval()
        return self


class ClassMeanUpdate(SupervisedPlugin):
    """After each experience: every class's mean L2-normalised feature over all training data seen.

    For an :class:`NCMModel`. Avalanche's ``update_ncm`` plugins do not fit:
    ``CurrentDataNCMUpdate`` blends a class's old and new means with momentum 0.5 when a
    class comes back (every class, in a domain-incremental stream) and runs one forward per class
    per batch; ``NCMOracle`` embeds all the data seen again after each experience. Running sums
    give the exact means with one pass over each experience. Like Avalanche's
    ``compute_class_means``: the mean of the normalised features, normalised; the data set's eval
    transforms. Normalising the sum gives that mean's direction, so no count is kept.
    """

    def __init__(self) -> None:
        super().__init__()
        self.sums: dict[int, Tensor] = {}  # per class: the sum of its normalised features

    def after_training_exp(self, strategy: SupervisedTemplate, **kwargs: Any) -> None:
        model: NCMModel = strategy.model
        for features, y in experience_features(strategy, model.features, kwargs):
            features = nn.functional.normalize(features, dim=-1)
            for label in y.unique().tolist():
                self.sums[label] = self.sums.get(label, 0) + features[y == label].sum(dim=0)
        model.classifier.replace_class_means_dict(
            {label: nn.functional.normalize(total, dim=0) for label, total in self.sums.items()})


class NCM(TrainingFreeTemplate):
    """Nearest class mean on a frozen timm ViT (SimpleCIL, Zhou et al., IJCV 2024), as an Avalanche strategy.

    Nothing trains: the epochs do nothing. After each training experience every class's mean is
    the mean of the L2-normalised pooled features of all its training samples seen so far (the
    data set's eval transforms), normalised; a sample scores each class by minus the Euclidean
    distance of its normalised feature to the class mean (the same order as their cosine). A class
    returning in a later experience (domain-incremental streams) gets the exact mean over all its
    samples. A class with no mean yet scores ``-inf``; the scores grow with the class ids seen, so
    no class count is given.
    """

    config_class = BaselineOptions
    model: NCMModel

    def __init__(
        self,
        model: nn.Module,
        config: Optional[BaselineOptions] = None,
        *,
        check_data: bool = BaselineOptions.check_data,
        train_mb_size: int = BaselineOptions.train_mb_size,
        eval_mb_size: int = BaselineOptions.eval_mb_size,
        # Avalanche's (StrategyBase)
        device: Union[str, torch.device] = "cpu",
        plugins: Optional[Sequence[BasePlugin]] = None,
        evaluator: Evaluator = default_evaluator,
        **template_options: Any,
    ) -> None:
        """NCM on ``model``, with the options of ``config`` and those given here; the others keep their defaults.

        Each option (``check_data`` to ``eval_mb_size``) is a field of
        :class:`~avalanche_color.baselines.options.BaselineOptions`, documented there; its default is the config's.
        ``device``, ``plugins``, ``evaluator`` and Avalanche's other keywords: as
        :class:`~avalanche_color.training.strategy.StrategyBase` says.

        Args:
            model: a timm ``VisionTransformer``; a frozen copy is used (the model given is not changed), its pooled
                features before any classifier head.
            config: all options as one :class:`~avalanche_color.baselines.options.BaselineOptions`; an option given
                here replaces its field.
        """
        options = dict(
            check_data=check_data, train_mb_size=train_mb_size, eval_mb_size=eval_mb_size)
        super().__init__(model=model, config=config, options=options, device=device, plugins=plugins,
                         evaluator=evaluator, template_options=template_options)

    def make_model(self, model: nn.Module) -> NCMModel:
        return NCMModel(frozen_copy(model))

    def own_plugins(self) -> list[BasePlugin]:
        return [ClassMeanUpdate()]
