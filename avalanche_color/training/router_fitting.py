"""Fit a routed model's router for the expert of each experience: the algorithm, and its Avalanche plugin.

:class:`RouterFitting` is the algorithm, with no strategy in it: it keeps the training data of the
experience whose expert trains (one data set, or the chunks of an online stream so far), knows
when that expert's router state is fitted for good, and fits it (the routing features of that data,
gathered from every rank under torchrun, clustered on the main process, given to ``model.router``),
in a seeded embedding pass. :class:`PrototypeRouterPlugin` maps Avalanche's callbacks to it: it fits the
router after training on each experience, or sooner if an evaluation needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
from avalanche.benchmarks.utils import concat_datasets
from avalanche.core import SupervisedPlugin
from avalanche.distributed import DistributedHelper
from torch.utils.data import Subset

from avalanche_color.config import LoaderOptions, PrototypeOptions
from avalanche_color.experts.routed_vit import RoutedExpertViT
from avalanche_color.routing.routers import kmeans_clustering
from avalanche_color.training.distributed import gather_features, is_distributed, on_main_process, shard
from avalanche_color.training.loaders import data_loader, loader_options
from avalanche_color.utils.experiences import (continues_experience, ends_experience, origin_experience,
                                                  refuse_chunks_without_boundaries)
from avalanche_color.utils.rng import seeded

if TYPE_CHECKING:
    from avalanche.training.templates import SupervisedTemplate


class RouterFitting:
    """The router fit of the experience whose expert trains now.

    Feed it that experience's training data (:meth:`add_data`, or :meth:`start_experience` with an
    Avalanche experience or online chunk), then :meth:`fit` the router for its expert. The fit is
    a seeded pass (the run's generators untouched), so it gives the same router state whenever it
    runs; :meth:`fitted_for_good` says when running it again cannot change anything.

    Args: a :class:`~avalanche_color.config.PrototypeOptions` and/or its options as keywords
    (``k``, ``kmeans_seed``, ``kmeans_n_init``, ``prototype_data``, ``prototype_batch_size``,
    ``prototypes_per_class``).

    Attributes:
        experience: the experience whose expert trains (an online chunk's origin experience), or None.
        chunks: its training data: one data set, or an online stream's chunks so far.
        fitted_chunks: how many of ``chunks`` the expert's router state was last fitted from.
    """

    def __init__(self, config: Optional[PrototypeOptions] = None, /, **options: Any) -> None:
        self.config = PrototypeOptions.build(config, **options)
        self.experience: Optional[Any] = None
        self.chunks: list[Any] = []
        self.fitted_chunks = 0

    def check_experience(self, experience: Any, who: str) -> None:
        """Refuse ``experience`` before its expert exists: a chunk of an online stream without task
        boundaries, or fewer samples than ``k`` (the whole experience's, for a chunk). ``who``: the
        strategy's name, for the message."""
        refuse_chunks_without_boundaries(experience, who)
        experience = origin_experience(experience)
        size = len(experience.dataset)
        if self.config.prototypes_per_class is None and self.config.k > size:
            raise ValueError(
                f"k must be at most the experience's sample count: k={self.config.k}, experience "
                f"{experience.current_experience} has {size} samples; use a smaller k"
            )

    def add_data(self, dataset: Any, *, continues: bool = False) -> None:
        """Add ``dataset`` (an Avalanche data set) to the experience's training data; it starts a new
        experience's data unless it ``continues`` the current one (a further chunk of an online stream)."""
        if not continues:
            self.chunks, self.fitted_chunks = [], 0
        self.chunks.append(dataset)

    def start_experience(self, experience: Any) -> None:
        """Training begins on ``experience`` (an Avalanche experience, or a chunk of an online stream
        with task boundaries): its data is added, to its origin experience's for a further chunk."""
        self.add_data(experience.dataset, continues=continues_experience(experience))
        self.experience = origin_experience(experience)

    @property
    def seen_samples(self) -> int:
        """The experience's training samples so far."""
        return sum(len(chunk) for chunk in self.chunks)

    def ends_experience(self, experience: Any) -> bool:
        """Whether training on ``experience`` completes the experience (always, except for an online
        stream's chunks before the last)."""
        return ends_experience(experience, self.seen_samples)

    def current_expert(self, model: RoutedExpertViT) -> Optional[int]:
        """The expert of :attr:`experience` in ``model``, while it is unfinished; else None."""
        return None if self.experience is None else model.bank.current_expert(self.experience.current_experience)

    def fitted_for_good(self, model: RoutedExpertViT, expert: int) -> bool:
        """Whether ``expert``'s router state is one that no further training can change.

        It is a function of the experience's data and the routing features, and the pass
        is seeded: while those features are frozen and no chunk has come since, fitting
        again gives the same. A router that reads no features (the oracle) needs no fit.
        """
        if not model.router.uses_features:
            return True
        return (model.router.knows(expert) and model.routing_features_frozen()
                and self.fitted_chunks == len(self.chunks))

    def finish(self, model: RoutedExpertViT, expert: int) -> None:
        """End the experience: ``expert`` and its router state are finished for good (:meth:`fit` it
        first unless it is :meth:`fitted_for_good`)."""
        self.experience = None
        model.finish_expert(expert)

    @torch.no_grad()
    def fit(self, model: RoutedExpertViT, expert: int, *, batch_size: Optional[int] = None,
            device: Optional[torch.device] = None, loader: Optional[LoaderOptions] = None) -> None:
        """Fit ``model``'s router for ``expert`` from the experience's training data so far.

        Args:
            model: the routed model; it is put in eval mode for the pass, and back.
            expert: the expert the data belongs to.
            batch_size: the embedding pass's; default: the config's ``prototype_batch_size``.
            device: where the batches go; default: the model's.
            loader: worker processes and pinned memory of the pass's loader (default: ``LoaderOptions()``).
        """
        config = self.config
        batch_size = batch_size or config.prototype_batch_size
        if batch_size is None:
            raise ValueError("RouterFitting.fit needs a batch_size: give one, or set prototype_batch_size")
        if not self.chunks:
            raise ValueError(f"no training data to fit expert {expert}'s router from: call add_data first")
        device = model.device if device is None else device
        self.fitted_chunks = len(self.chunks)
        dataset = self.chunks[0] if len(self.chunks) == 1 else concat_datasets(self.chunks)
        dataset = dataset.train() if config.prototype_data == "train" else dataset.eval()
        if is_distributed():  # each rank embeds its contiguous shard; the features are gathered
            dataset = Subset(dataset, shard(len(dataset), DistributedHelper.rank, DistributedHelper.world_size))
        was_training = model.training
        model.eval()
        features, labels = [], []
        # Seeded, and the run's generators untouched: the same prototypes whenever they are fitted.
        with seeded(config.kmeans_seed):
            for batch in data_loader(dataset, loader or LoaderOptions(), device, batch_size=batch_size):
                features.append(model.routing_features(batch[0].to(device)))
                labels.append(torch.as_tensor(batch[1], device=device))
        model.train(was_training)
        local = torch.cat(features) if features else torch.empty(0, model.num_features, device=device)
        local_labels = torch.cat(labels) if labels else torch.empty(0, dtype=torch.long, device=device)
        # Every rank fits the same router from all ranks' samples; k-means runs on rank 0 only.
        all_features, all_labels = gather_features(local), gather_features(local_labels)
        # k was checked against the whole experience; between an online stream's chunks, fewer may be seen.
        clustering = kmeans_clustering(min(config.k, len(all_labels)), per_class=config.prototypes_per_class,
                                       seed=config.kmeans_seed, n_init=config.kmeans_n_init)
        model.router.fit(expert, all_features, all_labels.to(all_features.device), clustering=on_main_process(clustering))


class PrototypeRouterPlugin(SupervisedPlugin, supports_distributed=True):
    """Fit the model's router for each experience: after training on it, or sooner if an evaluation needs it.

    The routing features (frozen backbone's, or with the first expert for CoLoR++) of the
    experience's training data and their labels go to the model's router
    (:class:`~avalanche_color.routing.routers.Router`): the prototype router clusters them by
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
    :class:`RouterFitting`, which works without a strategy too.
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
            self.fitting.fit(model, expert, **self.fit_options(strategy, kwargs))

    def after_training_exp(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        model = _routed(strategy.model)
        expert = self.fitting.current_expert(model)
        if expert is None or not self.fitting.ends_experience(strategy.experience):
            return  # the expert learns the next chunk of its experience first
        if not self.fitting.fitted_for_good(model, expert):
            self.fitting.fit(model, expert, **self.fit_options(strategy, kwargs))
        self.fitting.finish(model, expert)

    def fit_options(self, strategy: "SupervisedTemplate", call_options: dict[str, Any]) -> dict[str, Any]:
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
