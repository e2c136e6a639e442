"""What every strategy of the package adds to Avalanche's template, each part once.

* :class:`ModelFirst`: ``Strategy(model, **options)`` passes silently; later positional arguments warn as
  in Avalanche.
* :class:`LoaderDefaults`: the config's loader options reach every loader of ``train`` and ``eval``.
* :class:`ShardedEvaluation`: under torchrun each rank evaluates its own unpadded shard, and the
  metrics see every rank's batch.

Mix them in before ``SupervisedTemplate`` (their ``super()`` calls reach the template).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import Any, Callable, Optional

from avalanche.training.templates.base import _merge_legacy_positional_arguments

from avalanche_color.config import LoaderOptions
from avalanche_color.training.distributed import eval_loader, gather_eval_batch, is_distributed
from avalanche_color.training.loaders import loader_options


class ModelFirst:
    """A strategy whose ``__init__`` declares ``model`` as its first parameter gets :func:`model_first`
    in place of Avalanche's wrapper; a subclass without its own ``__init__`` keeps its parent's."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        init = cls.__init__
        super().__init_subclass__(**kwargs)  # Avalanche's BaseTemplate wraps __init__: see model_first
        if getattr(init, "takes_model_first", False):
            cls.__init__ = init  # type: ignore[method-assign]  # a parent's, already wrapped
        elif _declares_model_first(init):
            cls.__init__ = model_first(init)  # type: ignore[method-assign]


def _declares_model_first(init: Callable[..., None]) -> bool:
    parameters = list(inspect.signature(init).parameters.values())[1:]  # after self
    return bool(parameters) and parameters[0].name == "model" and parameters[0].kind in (
        inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def model_first(init: Callable[..., None]) -> Callable[..., None]:
    """A strategy's ``__init__`` called as Avalanche's strategies are, except that the model may come first.

    Avalanche's ``BaseTemplate`` wraps every strategy's ``__init__``: positional arguments warn
    (``PositionalArgumentsDeprecatedWarning``) and are passed on as keywords, and an ``__init__``
    that declares any positional parameter warns on every call. Here ``Strategy(model, **options)``
    is the documented call, so this wrapper takes the wrapper's place: the model alone given by
    position passes silently, and every positional argument after it gets Avalanche's own handling
    (its warning, its mapping onto the keyword-only parameters in order).
    """

    @functools.wraps(init)
    def init_model_first(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > 1:
            args, kwargs = _merge_legacy_positional_arguments(init, type(self).__name__, (self, *args), kwargs)
            return init(*args, **kwargs)
        return init(self, *args, **kwargs)

    init_model_first.takes_model_first = True  # type: ignore[attr-defined]
    return init_model_first


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
