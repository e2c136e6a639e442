"""A tiny seeded CoLoR run with checkpoints every epoch, importable and runnable as a script.

The fault test runs it as a subprocess and SIGKILLs it inside experience 3:

    python tests/checkpointed_run.py CHECKPOINT MARKER

writes MARKER when experience 3 (index 2) has finished two epochs, then slows
down so the kill lands inside that experience.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import torch
from avalanche.core import SupervisedPlugin
from avalanche.training.determinism.rng_manager import RNGManager

sys.path.insert(0, str(Path(__file__).parent))
from helpers import tiny_color  # noqa: E402
from streams import class_stream  # noqa: E402

from avalanche_color import train_stream  # noqa: E402

KILL_IN_EXPERIENCE = 2  # the third experience
EPOCHS = 4


class MarkWhenInside(SupervisedPlugin):
    """Writes ``marker`` once two epochs of the experience are done, then slows every iteration."""

    def __init__(self, marker: Path) -> None:
        super().__init__()
        self.marker = marker
        self.epochs = 0

    def before_training_epoch(self, strategy, **kwargs) -> None:
        if strategy.experience.current_experience != KILL_IN_EXPERIENCE:
            return
        if self.epochs == 2:  # epochs 1 and 2 of experience 3 are checkpointed by now
            self.marker.write_text("inside experience 3\n")
        self.epochs += 1

    def after_training_iteration(self, strategy, **kwargs) -> None:
        if self.marker.exists():
            time.sleep(0.5)


def run(checkpoint: Path, marker: Optional[Path] = None) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """Train the 4-experience tiny stream with a checkpoint every epoch (resuming if one exists).

    Returns the evaluation records and the final experts' state.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same in the test process and the subprocess
    try:
        RNGManager.set_random_seeds(0)
        benchmark = class_stream(num_experiences=4, per_class=10)
        plugins = [MarkWhenInside(marker)] if marker is not None else []
        strategy = tiny_color(train_epochs=EPOCHS, train_mb_size=10, k=2, plugins=plugins)
        records = train_stream(strategy, benchmark, checkpoint=checkpoint, every_n_epochs=1)
        return records, strategy.model.experts_state_dict()
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    run(Path(sys.argv[1]), Path(sys.argv[2]))
