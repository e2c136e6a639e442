"""What every strategy of the package adds to Avalanche's template, each part once.

* :class:`LoaderDefaults`: the config's loader options reach every loader of ``train`` and ``eval``.
* :class:`ShardedEvaluation`: under torchrun each rank evaluates its own unpadded shard, and the
  metrics see every rank's batch.

Mix them in before ``SupervisedTemplate`` (their ``super()`` calls reach the template).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from avalanche_color.config import LoaderOptions
from avalanche_color.training.distributed import eval_loader, gather_eval_batch, is_distributed
from avalanche_color.training.loaders import loader_options


class LoaderDefaults:
    """``train`` and ``eval`` with :attr:`loader_defaults` (``num_workers``, ...) unless the call gives them."""

    loader_defaults: LoaderOptions

    def train(self, experiences: Any, eval_streams: Optional[Sequence[Any]] = None, **kwargs: Any) -> Any:
        """Avalanche's ``train``; the config's loader options (``num_workers``, ...) apply unless given here."""
        return super().train(experiences, eval_streams, **self._with_loader_options(kwargs))  # type: ignore[misc]

    def eval(self, exp_list: Any, **kwargs: Any) -> Any:
        """Avalanche's ``eval``; the config's loader options (``num_workers``, ...) apply unless given here."""
        return super().eval(exp_list, **self._with_loader_options(kwargs))  # type: ignore[misc]

    def _with_loader_options(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        # Avalanche hands these keywords to its loaders and to every plugin callback (prototype
        # fitting, the data scan), so one value reaches every loader of the call.
        return {**kwargs, **loader_options(kwargs, self.loader_defaults).loader_options()}


class ShardedEvaluation:
    """Evaluation under torchrun: an unpadded shard per rank, the batches of all ranks for the metrics."""

    def make_eval_dataloader(self, **kwargs: Any) -> None:
        # Avalanche's distributed sampler pads the last batch, which would count samples twice.
        if is_distributed():
            self.dataloader = eval_loader(self.adapted_dataset, self.eval_mb_size,  # type: ignore[attr-defined]
                                          loader_options(kwargs), self.device)  # type: ignore[attr-defined]
        else:
            super().make_eval_dataloader(**kwargs)  # type: ignore[misc]

    def _after_eval_forward(self, **kwargs: Any) -> None:
        gather_eval_batch(self)  # first of all plugins: metrics then see the batches of all ranks
        super()._after_eval_forward(**kwargs)  # type: ignore[misc]
