"""The CoLoR paper's "FT + class masking" baseline: fine-tuning with only the current experience's classes' logits.

Built on Avalanche's ``Naive`` with an ``IncrementalClassifier(masking=True)`` head::

    head = IncrementalClassifier(vit.num_features, num_classes, masking=True, mask_value=float("-inf"))
    model = FeatureExtractorModel(vit, head)   # avalanche.models.utils; vit headless (num_classes=0)
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                     criterion=nn.CrossEntropyLoss(), plugins=[CurrentClassesMasking(head)], ...)
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from avalanche.core import SupervisedPlugin
from avalanche.models import IncrementalClassifier
from avalanche.training.templates import SupervisedTemplate
from torch import Tensor

from avalanche_color.utils.experiences import experience_classes


class CurrentClassesMasking(SupervisedPlugin):
    """The paper's "FT + class masking": while an experience trains, only its classes have logits.

    Avalanche's ``IncrementalClassifier(masking=True)`` masks (sets to ``mask_value``) the units in
    its ``active_units`` mask that are off; its model adaptation switches on the classes of each
    training experience and never switches any off, so it masks the classes no experience has
    trained yet, and earlier experiences' classes compete in training. The paper masks every class
    outside the current experience: this narrows the mask to the current experience's classes
    while it trains, and gives every class trained so far back for evaluation (also for an
    evaluation inside training).
    """

    def __init__(self, head: IncrementalClassifier) -> None:
        super().__init__()
        if not isinstance(head, IncrementalClassifier) or not head.masking:
            raise ValueError(f"head must be an avalanche.models.IncrementalClassifier built with masking=True (the "
                             f"classifier of the model the strategy trains), got {head!r}")
        self.head = head
        self.seen: Optional[Tensor] = None  # while an experience trains: every class trained so far
        self.current: Optional[Tensor] = None  # and its own classes

    def before_training_exp(self, strategy: SupervisedTemplate, **kwargs: Any) -> None:
        # Avalanche's model adaptation (just before) has switched the current classes on.
        self.seen = self.head.active_units.clone()
        self.current = torch.zeros_like(self.seen)
        self.current[experience_classes(strategy.experience)] = 1
        self._show(self.current)

    def after_training_exp(self, strategy: SupervisedTemplate, **kwargs: Any) -> None:
        self._show(self.seen)
        self.seen = self.current = None

    def before_eval(self, strategy: SupervisedTemplate, **kwargs: Any) -> None:
        if self.seen is not None:
            self._show(self.seen)

    def after_eval(self, strategy: SupervisedTemplate, **kwargs: Any) -> None:
        if self.current is not None:
            self._show(self.current)

    def _show(self, mask: Tensor) -> None:
        """Make ``mask`` the head's active units (an evaluation may have grown the head)."""
        units = torch.zeros_like(self.head.active_units)
        units[: len(mask)] = mask[: len(units)]
        self.head.active_units = units
