"""The training shared by the routed-expert strategies (CoLoR, S-Prompts).

One expert per training experience, trained alone with SGD and a cosine
schedule that restarts per experience; after each experience, k-means
prototypes for the router (:class:`~avalanche_color.PrototypeRouterPlugin`).
The strategies differ only in the model they build.
"""

from __future__ import annotations

from typing import Any

from avalanche.core import BasePlugin
from torch import Tensor
from torch.optim import SGD

from avalanche_color.config import PrototypeOptions, RoutedExpertsConfig
from avalanche_color.experts.routed_vit import RoutedExpertViT
from avalanche_color.training.configured_strategy import ConfiguredStrategy
from avalanche_color.training.plugin_compatibility import ROUTED_EXPERTS
from avalanche_color.training.router_plugin import PrototypeRouterPlugin


class RoutedExpertsTemplate(ConfiguredStrategy):
    """A :class:`RoutedExpertViT` trained expert by expert, with prototype routing.

    Subclasses name their model and config class (see
    :class:`~avalanche_color.training.configured_strategy.ConfiguredStrategy` for the call).
    """

    model: RoutedExpertViT
    config: RoutedExpertsConfig
    incompatible_plugins = ROUTED_EXPERTS
    optimizer_description = "SGD over the new expert, cosine-annealed over the experience"
    optimizer_options = ("lr", "momentum", "weight_decay")

    def own_plugins(self) -> list[BasePlugin]:
        return [PrototypeRouterPlugin(self.config.group(PrototypeOptions))]

    def forward(self) -> Tensor:
        """The model's forward (through DDP in training under torchrun): in training the expert that
        trains predicts, in evaluation each sample's routed expert (kept in the model's ``routed_experts``)."""
        # As Avalanche's forward: task labels only where the experience has them.
        task_labels = self.mb_task_id if hasattr(self.experience, "task_labels") else None
        return self.step_model()(self.mb_x, task_labels)

    def make_optimizer(self, **kwargs: Any) -> None:
        """A fresh SGD over the expert that trains only, with its schedule (:meth:`restart_schedule`)."""
        trainable = self.model.bank.trainable
        if trainable is None:
            raise RuntimeError("make_optimizer needs an expert that trains: the model adaptation adds one per experience")
        parameters = list(self.model.expert_parameters(trainable))
        config = self.config
        self.optimizer = SGD(parameters, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
        self.restart_schedule()

    def restart_schedule(self) -> None:
        """The schedule of the optimiser just made: cosine over the experience's steps."""
        self.restart_cosine()
