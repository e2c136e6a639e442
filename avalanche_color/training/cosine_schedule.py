"""Cosine annealing of the learning rate over one experience's steps, restarted with each optimiser."""

from __future__ import annotations

import math
from typing import Callable, Optional

from torch.optim.lr_scheduler import CosineAnnealingLR, LambdaLR, LRScheduler

from avalanche_color.utils.experiences import origin_experience


class PerExperienceCosine:
    """Mixin for an Avalanche template: call :meth:`restart_cosine` once its optimiser for the
    experience exists; the learning rate then anneals to zero over the experience's steps
    (``train_epochs`` x batches), stepping after every optimiser step. For a chunk of an online
    stream with task boundaries, that is over all chunks of its experience (as many as the first's)."""

    lr_scheduler: Optional[LRScheduler] = None

    def restart_cosine(self) -> None:
        steps = self._experience_steps()
        self.lr_scheduler = CosineAnnealingLR(self.optimizer, T_max=steps)  # type: ignore[attr-defined]

    def restart_epoch_cosine(self) -> None:
        """The ``CosineSchedule`` of InfLoRA's and LoRA subtraction's code (``utils/schedulers.py``), stepped
        once per epoch, as it runs: its constructor sets epoch 0's factor and then ``last_epoch = -1``, so
        the first ``step()``, after epoch 0, sets epoch 0's factor again. Epochs 0 and 1 of E run at lr,
        epoch e >= 1 at ``lr cos(99 pi (e - 1) / (200 (E - 1)))``: the last at 9.7% of lr for E = 20 (the
        formula's 1.6% is never reached). One epoch: lr throughout."""
        self.restart_epoch_cosine_over(self.train_epochs)  # type: ignore[attr-defined]

    def restart_epoch_cosine_over(self, length: int) -> None:
        """:meth:`restart_epoch_cosine` with the cosine's E = ``length``, while the experience runs
        ``train_epochs`` epochs (the code's ``CosineSchedule(K)`` with K other than the epochs run)."""

        def factor(epoch: int) -> float:
            late = max(epoch - 1, 0)  # the epoch whose factor the code's scheduler has set
            return math.cos(99 * math.pi * late / (200 * (length - 1))) if length > 1 else 1.0

        self._restart_per_epoch(factor)

    def restart_cosine_per_epoch(self) -> None:
        """torch's ``CosineAnnealingLR(T_max=epochs)`` (``eta_min`` 0) stepped once after each epoch, as
        S-Prompts' code (``methods/sprompt.py``, ``train_function``) runs it: epoch e of E runs at
        ``lr (1 + cos(pi e / E)) / 2``, the first at lr, the last at ``lr (1 + cos(pi (E - 1) / E)) / 2``
        (9.5% of lr for E = 5, 2.4% for E = 10: zero is never reached). One epoch: lr throughout."""
        epochs = self.train_epochs  # type: ignore[attr-defined]
        self._restart_per_epoch(lambda epoch: (1 + math.cos(math.pi * epoch / epochs)) / 2)

    def _restart_per_epoch(self, factor: Callable[[int], float]) -> None:
        """A schedule stepped per optimiser step that holds ``factor(epoch)`` through each of the experience's
        ``train_epochs`` epochs (a schedule the authors' code steps once per epoch)."""
        epochs = self.train_epochs  # type: ignore[attr-defined]
        per_epoch = max(self._experience_steps() // max(epochs, 1), 1)
        self.lr_scheduler = LambdaLR(self.optimizer,  # type: ignore[attr-defined]
                                     lambda step: factor(min(step // per_epoch, epochs - 1)))

    def _experience_steps(self) -> int:
        steps = self.train_epochs * max(len(self.dataloader), 1)  # type: ignore[attr-defined]
        experience = self.experience  # type: ignore[attr-defined]
        if origin_experience(experience) is not experience:
            steps *= experience.sub_stream_length or 1
        return steps

    def optimizer_step(self) -> None:
        super().optimizer_step()  # type: ignore[misc]
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
