"""ResumePlugin: saves a run after each experience and every N epochs, and loads it back to resume it.

Named apart from Avalanche's own ``CheckpointPlugin`` (deprecated since Avalanche 0.5 for ``save_checkpoint`` /
``maybe_load_checkpoint``), whose files it neither writes nor reads (docs/guide/checkpoints.md)."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import torch
from avalanche.core import SupervisedPlugin

from avalanche_color.experts.model_state import (backbone_fingerprint, model_extras, model_settings,
                                                 restore_model_extras)
from avalanche_color.training.checkpoint import Checkpoint, check_fits, read_checkpoint, write_checkpoint
from avalanche_color.training.resume_options import check_same_options, recorded_options
from avalanche_color.utils.checks import positive_int, require
from avalanche_color.utils.files import PathLike
from avalanche_color.utils.rng import capture_rng, restore_rng

if TYPE_CHECKING:
    from avalanche.training.templates import SupervisedTemplate

Record = dict[str, Any]


class ResumePlugin(SupervisedPlugin):
    """Save a CoLoR run to ``path`` after each training experience and every N epochs.

    Use it with a CoLoR strategy (its model an :class:`ExpertViT`), listed after
    the :class:`PrototypeRouterPlugin` (CoLoR puts that one first), so an
    experience's checkpoint holds its prototypes. Checkpoints at experience ends
    hold the learned state; those every ``every_n_epochs`` epochs also hold the
    optimiser and scheduler state, for a mid-experience resume.

    Args:
        path: the checkpoint file (written atomically, see :mod:`avalanche_color.training.checkpoint`).
        every_n_epochs: also save after every this many epochs inside an
            experience (default None: at experience ends only).

    Attributes:
        experiences_done: training experiences finished so far (the stream position).
        records: evaluation records so far, one per experience; saved with the run.
        stream_classes: each training experience's classes, saved so that a
            resume on another class set is refused (set by :func:`train_stream`).
    """

    def __init__(self, path: PathLike, every_n_epochs: Optional[int] = None) -> None:
        super().__init__()
        if every_n_epochs is not None:
            require("every_n_epochs", every_n_epochs, positive_int)
        self.path = Path(path)
        self.every_n_epochs = every_n_epochs
        self.experiences_done = 0
        self.records: list[Record] = []
        self.stream_classes: Optional[list[list[int]]] = None
        self._epochs_done = 0
        self._fingerprint: Optional[tuple[int, str]] = None  # (id of the model, digest): the backbone is frozen
        self._pending: Optional[Checkpoint] = None  # a mid-experience state to apply when training resumes
        self._full_train_epochs: Optional[int] = None

    # ------------------------------------------------------------------ saving

    def save(self, strategy: "SupervisedTemplate", epochs_done: int = 0) -> None:
        """Write the run's state now: at an experience boundary, or ``epochs_done`` into the next one."""
        model = strategy.model
        mid_experience = epochs_done > 0
        scheduler = getattr(strategy, "lr_scheduler", None)
        write_checkpoint(self.path, Checkpoint(
            experiences_done=self.experiences_done,
            epochs_done=epochs_done,
            train_epochs=self._full_train_epochs or strategy.train_epochs,
            records=self.records,
            settings=model_settings(model),
            backbone=self._backbone_fingerprint(model),
            stream_classes=self.stream_classes,
            experts=model.experts_state_dict(),
            model_extras=model_extras(model),
            optimizer=strategy.optimizer.state_dict() if mid_experience else None,
            lr_scheduler=scheduler.state_dict() if mid_experience and scheduler is not None else None,
            rng=capture_rng(),
            options=recorded_options(strategy),
        ))

    def before_training_exp(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        pending = self._pending
        if pending is None or strategy.experience.current_experience != pending.experiences_done:
            self._epochs_done = 0
            return
        # Resuming inside this experience: the optimiser was just rebuilt for its expert.
        strategy.optimizer.load_state_dict(pending.optimizer)
        if pending.lr_scheduler is not None and getattr(strategy, "lr_scheduler", None) is not None:
            strategy.lr_scheduler.load_state_dict(pending.lr_scheduler)
        self._epochs_done = pending.epochs_done
        self._full_train_epochs = strategy.train_epochs
        strategy.train_epochs = strategy.train_epochs - pending.epochs_done  # only the epochs left

    def before_training_epoch(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        if self._pending is not None and self._epochs_done == self._pending.epochs_done:
            # As late as possible: the next draw is this epoch's shuffle, as in the run that stopped.
            restore_rng(self._pending.rng)
            self._pending = None

    def after_training_epoch(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        self._epochs_done += 1
        total = self._full_train_epochs or strategy.train_epochs
        if self.every_n_epochs and self._epochs_done % self.every_n_epochs == 0 and self._epochs_done < total:
            self.save(strategy, epochs_done=self._epochs_done)

    def after_training_exp(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        if self._full_train_epochs is not None:
            strategy.train_epochs = self._full_train_epochs
            self._full_train_epochs = None
        self.experiences_done = int(strategy.experience.current_experience) + 1
        self.save(strategy)

    # ------------------------------------------------------------------ resuming

    def resume(self, strategy: "SupervisedTemplate", stream_classes: Optional[list[list[int]]] = None,
               allow_changed: Collection[str] = ()) -> Checkpoint:
        """Load the checkpoint at ``path`` into ``strategy`` (a fresh CoLoR strategy, no expert yet).

        The file, the model's settings, the backbone, (if given) the stream's classes and the
        strategy's other options (those not in :data:`OPTIONS_FREE_ON_RESUME` or ``allow_changed``)
        are all checked before anything changes; on any mismatch a :class:`CheckpointError` says
        what differs and the model stays as it was.
        A mid-experience state is applied when that experience's training starts.

        Returns:
            the checkpoint read (its ``experiences_done`` and ``records`` say where the run is).
        """
        model = strategy.model
        if not hasattr(model, "experts_state_dict"):
            raise TypeError(
                f"resume needs a CoLoR strategy (an ExpertViT model), got a {type(model).__name__} model"
            )
        if model.num_experts:
            raise ValueError(
                f"resume needs a fresh strategy whose model has no expert yet; this one has {model.num_experts}"
            )
        checkpoint = read_checkpoint(self.path)
        check_fits(checkpoint, model, self.path, stream_classes, self._backbone_fingerprint(model))
        check_same_options(checkpoint, strategy, self.path, allow_changed)
        if checkpoint.epochs_done and checkpoint.train_epochs != strategy.train_epochs:
            raise ValueError(
                f"checkpoint {self.path} stopped inside an experience of a run with train_epochs="
                f"{checkpoint.train_epochs}; this strategy has train_epochs={strategy.train_epochs}"
            )
        model.load_experts_state_dict({k: v.to(_device(model)) for k, v in checkpoint.experts.items()})
        restore_model_extras(model, checkpoint.model_extras)
        self.experiences_done = checkpoint.experiences_done
        self.records = list(checkpoint.records)
        self.stream_classes = checkpoint.stream_classes or stream_classes
        if checkpoint.epochs_done:
            self._pending = checkpoint
        else:
            restore_rng(checkpoint.rng)  # after loading: growing the model drew LoRA initialisations
        return checkpoint

    def _backbone_fingerprint(self, model: torch.nn.Module) -> str:
        if self._fingerprint is None or self._fingerprint[0] != id(model):
            self._fingerprint = (id(model), backbone_fingerprint(model))
        return self._fingerprint[1]


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device
