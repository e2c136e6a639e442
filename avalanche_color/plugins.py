"""Avalanche plugins: LoRA-expert injection and prototype fitting.

Each plugin is a thin wrapper: the method lives in :class:`ExpertViT` (or any
:class:`~avalanche_color.experts.RoutedExpertViT`, such as S-Prompts' model) and
:mod:`avalanche_color.prototypes`; the plugins only say *when* it runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Optional, get_args

import torch
from avalanche.core import SupervisedPlugin
from avalanche.distributed import DistributedHelper
from torch.utils.data import DataLoader, Subset

from avalanche_color.distributed import is_distributed, shard, shared_prototypes
from avalanche_color.experts import RoutedExpertViT
from avalanche_color.model import ExpertViT, Routing
from avalanche_color.prototypes import Distance, fit_prototypes
from avalanche_color.validation import check_choice, check_positive_int

if TYPE_CHECKING:
    from avalanche.training.templates import SupervisedTemplate

PrototypeData = Literal["train", "eval"]
PROTOTYPE_DATA: tuple[str, ...] = get_args(PrototypeData)


class LoRAExpertsPlugin(SupervisedPlugin):
    """Give any Avalanche strategy CoLoR's experts.

    Before training, the strategy's timm ViT becomes an :class:`ExpertViT`:
    frozen, with a rank-r LoRA expert on q and v of every block and a linear
    head for each training experience (added by Avalanche's model adaptation).
    Pair it with :class:`PrototypeRouterPlugin` to route at evaluation.

    Args: as :class:`ExpertViT`.
    """

    def __init__(
        self,
        rank: int = 64,
        *,
        alpha: Optional[float] = None,
        routing: Routing = "backbone",
        distance: Distance = "euclidean",
    ) -> None:
        super().__init__()
        self.options = dict(rank=rank, alpha=alpha, routing=routing, distance=distance)
        ExpertViT.check_options(**self.options)  # fail at construction, not mid-run

    def before_training(self, strategy: "SupervisedTemplate", **kwargs) -> None:
        if not isinstance(strategy.model, ExpertViT):
            strategy.model = ExpertViT(strategy.model, **self.options).to(strategy.device)


class PrototypeRouterPlugin(SupervisedPlugin, supports_distributed=True):
    """Fit each experience's prototypes after training on it.

    The features (frozen backbone's, or with the first expert for CoLoR++) of
    the experience's training data are clustered by k-means; the centres go to
    the model's router, so they are part of its ``state_dict``. Works for every
    routed expert model (CoLoR's LoRA experts, S-Prompts' prompt experts).

    Args:
        k: prototypes per experience (the paper: 5 domain-, 20 class-incremental).
        seed: k-means ``random_state``.
        n_init: k-means restarts.
        data: ``"train"`` embeds the training data as the training loader
            transforms it (as S-Prompts does); ``"eval"`` with the eval transforms.
        batch_size: batch size of the embedding pass; defaults to the strategy's
            eval mini-batch size.
    """

    def __init__(
        self,
        k: int = 5,
        *,
        seed: int = 0,
        n_init: int = 10,
        data: PrototypeData = "train",
        batch_size: Optional[int] = None,
    ) -> None:
        super().__init__()
        check_positive_int("k", k)
        check_positive_int("n_init", n_init)
        if batch_size is not None:
            check_positive_int("batch_size", batch_size)
        check_choice("data", data, PROTOTYPE_DATA)
        self.k = k
        self.seed = seed
        self.n_init = n_init
        self.data = data
        self.batch_size = batch_size

    def before_train_dataset_adaptation(self, strategy: "SupervisedTemplate", **kwargs) -> None:
        # Runs before the new expert is created, so a refused experience leaves no trace.
        size = len(strategy.experience.dataset)
        if self.k > size:
            raise ValueError(
                f"k must be at most the experience's sample count: k={self.k}, experience "
                f"{strategy.experience.current_experience} has {size} samples"
            )

    @torch.no_grad()
    def after_training_exp(self, strategy: "SupervisedTemplate", **kwargs) -> None:
        model = strategy.model
        if not isinstance(model, RoutedExpertViT):
            raise TypeError(
                f"PrototypeRouterPlugin needs a RoutedExpertViT model (ExpertViT, PromptExpertViT), "
                f"got {type(model).__name__}"
            )
        experience_id = strategy.experience.current_experience
        expert = int((model.expert_experiences == experience_id).nonzero()[0])
        dataset = strategy.experience.dataset
        dataset = dataset.train() if self.data == "train" else dataset.eval()
        batch_size = self.batch_size or strategy.eval_mb_size or strategy.train_mb_size
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
        centres = shared_prototypes(local, lambda f: fit_prototypes(f, self.k, seed=self.seed, n_init=self.n_init))
        model.router.set_prototypes(expert, centres)

