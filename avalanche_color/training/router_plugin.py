"""Fit the router for each experience's expert after training on it, as an Avalanche plugin."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
from avalanche.benchmarks.utils import concat_datasets
from avalanche.core import SupervisedPlugin
from avalanche.distributed import DistributedHelper
from torch.utils.data import Subset

from avalanche_color.config import PrototypeOptions
from avalanche_color.experts.routed_vit import RoutedExpertViT
from avalanche_color.routing.prototypes import kmeans_clustering
from avalanche_color.training.distributed import gather_features, is_distributed, on_main_process, shard
from avalanche_color.training.loaders import data_loader, loader_options
from avalanche_color.utils.experiences import (continues_experience, ends_experience, origin_experience,
                                                  refuse_chunks_without_boundaries)
from avalanche_color.utils.rng import seeded

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
    """

    def __init__(self, config: Optional[PrototypeOptions] = None, /, **options: Any) -> None:
        super().__init__()
        self.config = PrototypeOptions.build(config, **options)
        self._training: Optional[Any] = None  # the experience whose expert is training now
        self._chunks: list[Any] = []  # its training data: one data set, or an online stream's chunks so far
        self._fitted_chunks = 0  # how many of them the expert's prototypes were fitted from

    def before_train_dataset_adaptation(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        # Runs before the new expert is created, so a refused experience leaves no trace.
        refuse_chunks_without_boundaries(strategy.experience, type(strategy).__name__)
        experience = origin_experience(strategy.experience)
        size = len(experience.dataset)
        if self.config.prototypes_per_class is None and self.config.k > size:
            raise ValueError(
                f"k must be at most the experience's sample count: k={self.config.k}, experience "
                f"{experience.current_experience} has {size} samples; use a smaller k"
            )

    def before_training_exp(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        if not continues_experience(strategy.experience):
            self._chunks, self._fitted_chunks = [], 0
        self._chunks.append(strategy.experience.dataset)
        self._training = origin_experience(strategy.experience)

    def before_eval(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        # An evaluation inside training (Avalanche's periodic evaluation, early stopping, or
        # between the chunks of an online stream): the expert being trained gets its prototypes
        # now, so evaluation reaches it.
        model, experience = _routed(strategy.model), self._training
        expert = None if experience is None else model.bank.current_expert(experience.current_experience)
        if expert is not None and not self._fitted_for_good(model, expert):
            self._fit(strategy, expert, kwargs)

    def after_training_exp(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        model, experience = _routed(strategy.model), self._training
        expert = None if experience is None else model.bank.current_expert(experience.current_experience)
        if expert is None or not ends_experience(strategy.experience, sum(len(c) for c in self._chunks)):
            return  # the expert learns the next chunk of its experience first
        self._training = None
        if not self._fitted_for_good(model, expert):
            self._fit(strategy, expert, kwargs)
        model.finish_expert(expert)

    def _fitted_for_good(self, model: RoutedExpertViT, expert: int) -> bool:
        """Whether ``expert``'s router state is one that no further training can change.

        It is a function of the experience's data and the routing features, and the pass
        is seeded: while those features are frozen and no chunk has come since, fitting
        again gives the same. A router that reads no features (the oracle) needs no fit.
        """
        if not model.router.uses_features:
            return True
        return (model.router.knows(expert) and model.routing_features_frozen()
                and self._fitted_chunks == len(self._chunks))

    @torch.no_grad()
    def _fit(self, strategy: "SupervisedTemplate", expert: int, call_options: dict[str, Any]) -> None:
        """Fit the router for ``expert``; ``call_options``: the keywords of the strategy's ``train``/``eval``
        call (its ``num_workers``, ``pin_memory`` and ``persistent_workers`` set the loader)."""
        model, config = strategy.model, self.config
        self._fitted_chunks = len(self._chunks)
        dataset = self._chunks[0] if len(self._chunks) == 1 else concat_datasets(self._chunks)
        dataset = dataset.train() if config.prototype_data == "train" else dataset.eval()
        batch_size = config.prototype_batch_size or strategy.eval_mb_size or strategy.train_mb_size
        if is_distributed():  # each rank embeds its contiguous shard; the features are gathered
            dataset = Subset(dataset, shard(len(dataset), DistributedHelper.rank, DistributedHelper.world_size))
        was_training = model.training
        model.eval()
        features, labels = [], []
        # Seeded, and the run's generators untouched: the same prototypes whenever they are fitted.
        with seeded(config.kmeans_seed):
            loader = data_loader(dataset, loader_options(call_options), strategy.device, batch_size=batch_size)
            for batch in loader:
                features.append(model.routing_features(batch[0].to(strategy.device)))
                labels.append(torch.as_tensor(batch[1], device=strategy.device))
        model.train(was_training)
        local = torch.cat(features) if features else torch.empty(0, model.num_features, device=strategy.device)
        local_labels = torch.cat(labels) if labels else torch.empty(0, dtype=torch.long, device=strategy.device)
        # Every rank fits the same router from all ranks' samples; k-means runs on rank 0 only.
        all_features, all_labels = gather_features(local), gather_features(local_labels)
        # k was checked against the whole experience; between an online stream's chunks, fewer may be seen.
        clustering = kmeans_clustering(min(config.k, len(all_labels)), per_class=config.prototypes_per_class,
                                       seed=config.kmeans_seed, n_init=config.kmeans_n_init)
        model.router.fit(expert, all_features, all_labels.to(all_features.device), clustering=on_main_process(clustering))


def _routed(model: Any) -> RoutedExpertViT:
    if not isinstance(model, RoutedExpertViT):
        raise TypeError(
            f"PrototypeRouterPlugin needs a RoutedExpertViT model (ExpertViT, PromptExpertViT), "
            f"got {type(model).__name__}"
        )
    return model
