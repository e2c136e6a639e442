"""Fit the router for each experience's expert after training on it, as an Avalanche plugin.

The algorithm and its state are :class:`~avalanche_color.training.router_fitting.RouterFitting`'s;
the plugin maps Avalanche's callbacks to it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from avalanche.core import SupervisedPlugin

from avalanche_color.config import PrototypeOptions
from avalanche_color.experts.routed_vit import RoutedExpertViT
from avalanche_color.training.loaders import loader_options
from avalanche_color.training.router_fitting import RouterFitting

if TYPE_CHECKING:
    from avalanche.training.templates import SupervisedTemplate


class PrototypeRouterPlugin(SupervisedPlugin, supports_distributed=True):
    """Fit the model's router for each experience: after training on it, or sooner if an evaluation needs it.

    The routing features (frozen backbone's, or with the first expert for CoLoR++) of the
    experience's training data and their labels go to the model's router
    (:class:`~avalanche_color.routing.router.Router`): the prototype router clusters them by
    k-means, a class router accumulates its statistics, the oracle needs neither (no pass is
    made). What the router learns is part of the model's ``state_dict``. An evaluation
    during the experience (Avalanche's periodic evaluation) fits them when it
    starts, so it reaches the expert being trained; the pass is seeded, so these
    are the prototypes the end of the experience would fit. Works for every
    routed expert model (CoLoR's LoRA experts, S-Prompts' prompt experts).

    Online streams (Avalanche's ``split_online_stream`` with ``access_task_boundaries=True``):
    one expert learns all chunks of an experience, and its prototypes are fitted from all
    of them once its last chunk is trained. An evaluation between chunks fits them from the
    chunks so far, with at most one prototype per sample seen. ``k`` must not exceed the
    experience's sample count (the whole experience's, for an online stream): a smaller
    experience is refused before training on it.

    Args: a :class:`~avalanche_color.config.PrototypeOptions` and/or its options as
    keywords: ``k``, ``kmeans_seed``, ``kmeans_n_init``, ``prototype_data``
    (``"train"`` embeds the training data as the training loader transforms it, as
    S-Prompts does; ``"eval"`` with the eval transforms), ``prototype_batch_size``
    (default: the strategy's eval mini-batch size) and ``prototypes_per_class``. The embedding
    pass loads data with the loader options of the strategy's ``train``/``eval`` call (``num_workers``, ...).

    The fit and its state (the experience's data so far) are :attr:`fitting`, a
    :class:`~avalanche_color.training.router_fitting.RouterFitting`, which works without a strategy too.
    """

    def __init__(self, config: Optional[PrototypeOptions] = None, /, **options: Any) -> None:
        super().__init__()
        self.fitting = RouterFitting(config, **options)

    @property
    def config(self) -> PrototypeOptions:
        return self.fitting.config

    def before_train_dataset_adaptation(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        # Runs before the new expert is created, so a refused experience leaves no trace.
        self.fitting.check_experience(strategy.experience, type(strategy).__name__)

    def before_training_exp(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        self.fitting.start_experience(strategy.experience)

    def before_eval(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        # An evaluation inside training (Avalanche's periodic evaluation, early stopping, or
        # between the chunks of an online stream): the expert being trained gets its prototypes
        # now, so evaluation reaches it.
        model = _routed(strategy.model)
        expert = self.fitting.current_expert(model)
        if expert is not None and not self.fitting.fitted_for_good(model, expert):
            self.fitting.fit(model, expert, **self._fit_options(strategy, kwargs))

    def after_training_exp(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        model = _routed(strategy.model)
        expert = self.fitting.current_expert(model)
        if expert is None or not self.fitting.ends_experience(strategy.experience):
            return  # the expert learns the next chunk of its experience first
        if not self.fitting.fitted_for_good(model, expert):
            self.fitting.fit(model, expert, **self._fit_options(strategy, kwargs))
        self.fitting.finish(model, expert)

    def _fit_options(self, strategy: "SupervisedTemplate", call_options: dict[str, Any]) -> dict[str, Any]:
        """The fit's arguments from the strategy and ``call_options``, the keywords of its ``train``/``eval``
        call (its ``num_workers``, ``pin_memory`` and ``persistent_workers`` set the loader)."""
        return dict(batch_size=self.config.prototype_batch_size or strategy.eval_mb_size or strategy.train_mb_size,
                    device=strategy.device, loader=loader_options(call_options))


def _routed(model: Any) -> RoutedExpertViT:
    if not isinstance(model, RoutedExpertViT):
        raise TypeError(
            f"PrototypeRouterPlugin needs a RoutedExpertViT model (ExpertViT, PromptExpertViT), "
            f"got {type(model).__name__}"
        )
    return model
