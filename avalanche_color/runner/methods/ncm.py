"""NCM (SimpleCIL) on the frozen backbone, and the template of the baselines that train nothing."""

from __future__ import annotations

from typing import Any

from avalanche.core import SupervisedPlugin
from avalanche.models import NCMClassifier
from avalanche.training.templates import SupervisedTemplate
from torch import Tensor, nn

from avalanche_color.runner.methods.features import experience_features


class SeenClassesNCM(NCMClassifier):
    """Avalanche's ``NCMClassifier``, with ``-inf`` for classes that have no mean yet.

    It stores a zero mean for a class id below the largest seen that has none (a class of a
    later experience, in a class-incremental stream); a zero mean is at distance 1 from every
    L2-normalised feature, nearer than a real class mean whose cosine with the feature is below 0.5.
    """

    def forward(self, x: Tensor) -> Tensor:
        scores = super().forward(x)
        return scores.masked_fill(~self.class_means.to(x.device).any(dim=1), float("-inf"))


class ClassMeanUpdate(SupervisedPlugin):
    """After each experience: every class's mean L2-normalised feature over all training data seen.

    For a model with a ``feature_extractor`` and an ``NCMClassifier`` as ``eval_classifier``
    (Avalanche's ``TrainEvalModel``, as its ``update_ncm`` plugins expect). Those plugins do not
    fit: ``CurrentDataNCMUpdate`` blends a class's old and new means with momentum 0.5 when a
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
        model = strategy.model
        for features, y in experience_features(strategy, model.feature_extractor, kwargs):
            features = nn.functional.normalize(features, dim=-1)
            for label in y.unique().tolist():
                self.sums[label] = self.sums.get(label, 0) + features[y == label].sum(dim=0)
        model.eval_classifier.replace_class_means_dict(
            {label: nn.functional.normalize(total, dim=0) for label, total in self.sums.items()})


class TrainingFree(SupervisedTemplate):
    """NCM and RanPAC on the frozen backbone: no gradient step, the epochs do nothing; a plugin
    (:class:`ClassMeanUpdate`, :class:`~avalanche_color.runner.methods.ranpac.RidgeUpdate`) fits the
    classifier after each experience. The optimiser, which Avalanche's template requires, never steps."""

    def training_epoch(self, **kwargs: Any) -> None:
        pass
