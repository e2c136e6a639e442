"""Cosine annealing of the learning rate over one experience's steps, restarted with each optimiser."""

from __future__ import annotations

from typing import Optional

from torch.optim.lr_scheduler import CosineAnnealingLR

from avalanche_color.utils.experiences import origin_experience


class PerExperienceCosine:
    """Mixin for an Avalanche template: call :meth:`restart_cosine` once its optimiser for the
    experience exists; the learning rate then anneals to zero over the experience's steps
    (``train_epochs`` x batches), stepping after every optimiser step. For a chunk of an online
    stream with task boundaries, that is over all chunks of its experience (as many as the first's)."""

    lr_scheduler: Optional[CosineAnnealingLR] = None

    def restart_cosine(self) -> None:
        steps = self.train_epochs * max(len(self.dataloader), 1)  # type: ignore[attr-defined]
        experience = self.experience  # type: ignore[attr-defined]
        if origin_experience(experience) is not experience:
            steps *= experience.sub_stream_length or 1
        self.lr_scheduler = CosineAnnealingLR(self.optimizer, T_max=steps)  # type: ignore[attr-defined]

    def optimizer_step(self) -> None:
        super().optimizer_step()  # type: ignore[misc]
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
