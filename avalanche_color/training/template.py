"""The training shared by the routed-expert strategies (CoLoR, S-Prompts).

One expert per training experience, trained alone with SGD and a cosine
schedule that restarts per experience; after each experience, k-means
prototypes for the router (:class:`~avalanche_color.PrototypeRouterPlugin`).
The strategies differ only in the model they build.
"""

from __future__ import annotations

from typing import Any, Optional

from avalanche.core import BasePlugin
from torch import Tensor, nn
from torch.optim import SGD

from avalanche_color.config import PrototypeOptions, RoutedExpertsConfig
from avalanche_color.experts.routed_vit import RoutedExpertViT
from avalanche_color.training.router_plugin import PrototypeRouterPlugin
from avalanche_color.training.configured_strategy import ConfiguredStrategy
from avalanche_color.training.cosine_schedule import PerExperienceCosine
from avalanche_color.training.data_checks import DataChecksPlugin
from avalanche_color.training.distributed import wrap_current_expert
from avalanche_color.training.strategy_parts import ShardedEvaluation
from avalanche_color.utils.experiences import continues_experience
from avalanche_color.training.plugin_compatibility import ROUTED_EXPERTS


class RoutedExpertsTemplate(ShardedEvaluation, PerExperienceCosine, ConfiguredStrategy):
    """A :class:`RoutedExpertViT` trained expert by expert, with prototype routing.

    Subclasses name their model and config class (see
    :class:`~avalanche_color.training.configured_strategy.ConfiguredStrategy` for the call).
    """

    model: RoutedExpertViT
    config: RoutedExpertsConfig
    incompatible_plugins = ROUTED_EXPERTS
    optimizer_description = "SGD over the new expert, cosine-annealed over the experience"
    optimizer_options = ("lr", "momentum", "weight_decay")
    # Under torchrun: the model in DDP over the current expert, for training steps (set per experience).
    ddp_model: Optional[nn.Module] = None

    def first_optimizer(self, model: nn.Module) -> SGD:
        # Replaced by make_optimizer before each experience, once its expert exists.
        return SGD(model.parameters(), lr=self.config.lr)

    def own_plugins(self) -> list[BasePlugin]:
        # Bad data is refused first, before any other plugin or the model adaptation acts on it.
        return [DataChecksPlugin(scan_experiences=self.config.check_data),
                PrototypeRouterPlugin(self.config.group(PrototypeOptions))]

    def check_model_and_optimizer(self, **kwargs: Any) -> None:
        # The optimiser holds only the new expert, so it is built after the
        # model adaptation that creates it, once per experience (the chunks of an
        # online stream's experience continue its expert, optimiser and schedule).
        experts = self.model.num_experts
        self.model = self.model_adaptation()
        self.ddp_model = wrap_current_expert(self.model)
        if self.model.num_experts != experts or not continues_experience(self.experience):
            self.make_optimizer(**kwargs)

    def forward(self) -> Tensor:
        """The model's forward (through DDP in training under torchrun): in training the expert that
        trains predicts, in evaluation each sample's routed expert (kept in the model's ``routed_experts``)."""
        # As Avalanche's forward: task labels only where the experience has them.
        task_labels = self.mb_task_id if hasattr(self.experience, "task_labels") else None
        model = self.ddp_model if self.is_training and self.ddp_model is not None else self.model
        return model(self.mb_x, task_labels)

    def make_optimizer(self, **kwargs: Any) -> None:
        """A fresh SGD over the expert that trains only, with a cosine schedule over the experience."""
        trainable = self.model.bank.trainable
        if trainable is None:
            raise RuntimeError("make_optimizer needs an expert that trains: the model adaptation adds one per experience")
        parameters = list(self.model.expert_parameters(trainable))
        config = self.config
        self.optimizer = SGD(parameters, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
        self.restart_cosine()

