"""Fit each experience's prototypes after training on it, as an Avalanche plugin."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
from avalanche.core import SupervisedPlugin
from avalanche.distributed import DistributedHelper
from torch.utils.data import DataLoader, Subset

from avalanche_color.config import PrototypeOptions
from avalanche_color.experts.routed_vit import RoutedExpertViT
from avalanche_color.routing.prototypes import fit_prototypes
from avalanche_color.training.distributed import is_distributed, shard, shared_prototypes

if TYPE_CHECKING:
    from avalanche.training.templates import SupervisedTemplate


class PrototypeRouterPlugin(SupervisedPlugin, supports_distributed=True):
    """Fit each experience's prototypes after training on it.

    The features (frozen backbone's, or with the first expert for CoLoR++) of
    the experience's training data are clustered by k-means; the centres go to
    the model's router, so they are part of its ``state_dict``. Works for every
    routed expert model (CoLoR's LoRA experts, S-Prompts' prompt experts).

    Args: a :class:`~avalanche_color.config.PrototypeOptions` and/or its options as
    keywords: ``k``, ``kmeans_seed``, ``kmeans_n_init``, ``prototype_data``
    (``"train"`` embeds the training data as the training loader transforms it, as
    S-Prompts does; ``"eval"`` with the eval transforms) and ``prototype_batch_size``
    (default: the strategy's eval mini-batch size).
    """

    def __init__(self, config: Optional[PrototypeOptions] = None, /, **options: Any) -> None:
        super().__init__()
        self.config = PrototypeOptions.build(config, **options)

    def before_train_dataset_adaptation(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        # Runs before the new expert is created, so a refused experience leaves no trace.
        size = len(strategy.experience.dataset)
        if self.config.k > size:
            raise ValueError(
                f"k must be at most the experience's sample count: k={self.config.k}, experience "
                f"{strategy.experience.current_experience} has {size} samples"
            )

    @torch.no_grad()
    def after_training_exp(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        model = strategy.model
        if not isinstance(model, RoutedExpertViT):
            raise TypeError(
                f"PrototypeRouterPlugin needs a RoutedExpertViT model (ExpertViT, PromptExpertViT), "
                f"got {type(model).__name__}"
            )
        experience_id = strategy.experience.current_experience
        expert = int((model.expert_experiences == experience_id).nonzero()[0])
        dataset = strategy.experience.dataset
        dataset = dataset.train() if self.config.prototype_data == "train" else dataset.eval()
        batch_size = self.config.prototype_batch_size or strategy.eval_mb_size or strategy.train_mb_size
        was_training = model.training
        model.eval()
        if is_distributed():  # each rank embeds its contiguous shard; the features are gathered
            dataset = Subset(dataset, shard(len(dataset), DistributedHelper.rank, DistributedHelper.world_size))
        features = [
            model.routing_features(batch[0].to(strategy.device))
            for batch in DataLoader(dataset, batch_size=batch_size, shuffle=False)
        ]
        model.train(was_training)
        local = torch.cat(features) if features else torch.empty(0, model.num_features, device=strategy.device)
        config = self.config
        centres = shared_prototypes(
            local, lambda f: fit_prototypes(f, config.k, seed=config.kmeans_seed, n_init=config.kmeans_n_init))
        model.router.set_prototypes(expert, centres)

