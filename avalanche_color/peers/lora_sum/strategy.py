"""The training shared by SD-LoRA and InfLoRA: one adapted ViT, one head, old classes left out of the loss.

Per training experience: the model adds its component and grows the head
(:meth:`LoRASumViT.adaptation`), the method prepares it (InfLoRA designs ``A_t``), then a fresh
optimiser (SGD or Adam, constant or cosine learning rate over the experience) trains what the
model marks trainable. The training loss is the cross-entropy over the logits of the
experience's own classes only (both codes: ``logits[:, known_classes:]`` against
``targets - known_classes``), so the rows of earlier classes get no gradient; evaluation uses
the whole head. Under torchrun the model is wrapped in DDP over its trainable parameters and
every rank evaluates a shard (as CoLoR, :mod:`avalanche_color.training.distributed`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from avalanche_color.config import Options
from avalanche_color.peers.lora_sum.model import LoRASumViT
from avalanche_color.training.strategy import StrategyBase, incompatible_plugin_reasons
from avalanche_color.utils.experiences import ends_experience

# The Avalanche plugins SD-LoRA, InfLoRA and LoRA subtraction refuse, and why (CL-LoRA's, with its own schedule's
# reason); every other plugin is passed through.
_PROTECTS_ITSELF = ("the method protects earlier experiences itself, and its parameters grow with every "
                    "experience, so a distillation or regularisation term would not line up with them")
LORA_SUM = incompatible_plugin_reasons(
    replay="the method is rehearsal-free and trains on the logits of the current experience's classes only, so "
           "replayed samples of earlier classes would get an infinite loss",
    distillation=_PROTECTS_ITSELF,
    regularisation=_PROTECTS_ITSELF,
    schedule="the strategy builds a fresh optimiser and schedule per experience (lr_schedule=); a scheduler bound "
             "to another optimiser would be silently ignored",
    fresh_model="resetting the model would discard every component learned so far",
)


class LoRASumTemplate(StrategyBase):
    """The :class:`~avalanche_color.training.strategy.StrategyBase` of a :class:`LoRASumViT`: the model takes
    the method's whole config, a ready model brings its expert settings; subclasses write their ``__init__`` and
    may override :meth:`prepare_experience` and :meth:`conclude_component`.
    """

    model: LoRASumViT
    incompatible_plugins = LORA_SUM
    optimizer_description = "SGD or Adam over the new component, the magnitudes and the classifier"
    optimizer_options = ("optimizer", "lr", "momentum", "weight_decay", "lr_schedule")

    @classmethod
    def model_settings(cls) -> tuple[str, ...]:
        # The options that decide what the model's weights mean; the rest (lr, ...) is the strategy's.
        return cls.config_class.expert_setting_names()

    @classmethod
    def build_model(cls, vit: nn.Module, model_config: Options) -> nn.Module:
        return cls.model_class(vit, model_config)  # a LoRASumViT adapts a copy of the ViT itself

    def conclude_component(self, **kwargs: Any) -> None:
        """After the experience's training, before its component is frozen (InfLoRA protects its inputs)."""

    def make_optimizer(self, **kwargs: Any) -> None:
        """A fresh optimiser over what trains now; a cosine schedule over the experience if asked for."""
        config = self.config
        trainable = list(self.model.trainable_parameters())
        self.optimizer: torch.optim.Optimizer
        if config.optimizer == "sgd":
            self.optimizer = torch.optim.SGD(trainable, lr=config.lr, momentum=config.momentum,
                                             weight_decay=config.weight_decay)
        else:
            self.optimizer = torch.optim.Adam(trainable, lr=config.lr, betas=(0.9, 0.999),
                                              weight_decay=config.weight_decay)
        self.restart_schedule()

    def restart_schedule(self) -> None:
        """The learning-rate schedule of the optimiser just made, as ``lr_schedule``: ``"cosine"`` over the
        experience's steps, ``"epoch_cosine"`` per epoch, or none (``"constant"``)."""
        if self.config.lr_schedule == "cosine":
            self.restart_cosine()
        elif self.config.lr_schedule == "epoch_cosine":
            self.restart_epoch_cosine()
        else:
            self.lr_scheduler = None

    def _after_training_exp(self, **kwargs: Any) -> None:
        # Frozen before any plugin (checkpoint, evaluation) sees the experience's end.
        self._seen_samples = getattr(self, "_seen_samples", 0) + len(self.experience.dataset)
        if ends_experience(self.experience, self._seen_samples):
            self.conclude_component(**kwargs)
            self.model.finish_component()
            self.model.set_trainable()
            self._seen_samples = 0
        super()._after_training_exp(**kwargs)

    def criterion(self) -> Tensor:
        """Training: the loss over the current experience's classes only. Evaluation: over every class."""
        if not self.is_training:
            return self._criterion(self.mb_output, self.mb_y)
        current = self.model.current_classes
        logits = self.mb_output[:, : len(current)].masked_fill(~current, float("-inf"))
        return self._criterion(logits, self.mb_y)
