"""Progress inside a long run: a bar per training experience, with the epoch, the iteration and an ETA.

``CoLoR seed 0: experience 2/5`` over the experience's iterations (all its epochs), with
``epoch 3/50`` beside it and tqdm's rate and remaining time. A plain Avalanche plugin: give it to
any strategy (``plugins=[TrainingProgress("CoLoR", len(benchmark.train_stream))]``); the comparison
runner adds one to each run's strategy, below its own bar (``--quiet`` leaves it out).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from avalanche.core import SupervisedPlugin
from tqdm import tqdm

if TYPE_CHECKING:
    from avalanche.training.templates import SupervisedTemplate


class TrainingProgress(SupervisedPlugin):
    """A tqdm bar per training experience over its iterations, naming the experience and the epoch.

    Args:
        label: what the bar is for (the run: method and seed).
        num_experiences: the stream's training experiences (for "experience i/n").
        position: the bar's line below the comparison's own bar.
    """

    def __init__(self, label: str, num_experiences: int, position: int = 1) -> None:
        super().__init__()
        self.label = label
        self.num_experiences = num_experiences
        self.position = position
        self.bar: Optional[tqdm] = None
        self._epochs = 0  # the experience's epochs, those done before a resume included
        self._skipped = 0  # done before a resume inside the experience

    def before_training_exp(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        self._close()

    def before_training_epoch(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        if self.bar is None:  # the experience's first epoch: every plugin has set up its training by now
            self._open(strategy)
        epoch = self._skipped + strategy.clock.train_exp_epochs + 1
        self.bar.set_postfix_str(f"epoch {epoch}/{self._epochs}")  # once an epoch: shown at once

    def _open(self, strategy: "SupervisedTemplate") -> None:
        # A run resumed inside the experience trains only the epochs left (strategy.train_epochs): the bar
        # counts those, and names the epochs as the whole experience does.
        self._skipped = sum(getattr(plugin, "epochs_skipped", 0) for plugin in strategy.plugins)
        left = int(strategy.train_epochs)
        self._epochs = self._skipped + left
        per_epoch = len(strategy.dataloader) if hasattr(strategy.dataloader, "__len__") else None
        total = None if per_epoch is None else per_epoch * left
        experience = int(strategy.experience.current_experience) + 1
        self.bar = tqdm(total=total, desc=f"{self.label}: experience {experience}/{self.num_experiences}",
                        unit="it", leave=False, position=self.position, dynamic_ncols=True)

    def after_training_iteration(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        if self.bar is not None:
            self.bar.update()

    def after_training_exp(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        self._close()

    def after_training(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        self._close()

    def _close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
