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

from collections.abc import Sequence
from typing import Any, Callable, Optional, Union

import torch
from avalanche.core import BasePlugin
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.templates import SupervisedTemplate
from torch import Tensor, nn

from avalanche_color.config import LoaderOptions
from avalanche_color.peers.lora_sum.model import LoRASumViT
from avalanche_color.training.cosine_schedule import PerExperienceCosine
from avalanche_color.training.data_checks import DataChecksPlugin
from avalanche_color.training.distributed import wrap_current_expert
from avalanche_color.training.precision import MixedPrecision
from avalanche_color.training.strategy_parts import LoaderDefaults, ModelFirst, ShardedEvaluation
from avalanche_color.training.plugin_compatibility import refuse_incompatible_plugins
from avalanche_color.utils.experiences import continues_experience, ends_experience

REFUSED_PLUGINS = {
    **dict.fromkeys(("ReplayPlugin", "GDumbPlugin", "GSS_greedyPlugin", "MIRPlugin", "RARPlugin", "BiCPlugin",
                     "GenerativeReplayPlugin", "AGEMPlugin", "GEMPlugin", "CoPEPlugin"),
                    "the method is rehearsal-free and trains on the logits of the current experience's classes "
                    "only, so replayed samples of earlier classes would get an infinite loss"),
    **dict.fromkeys(("LwFPlugin", "LFLPlugin", "FeatureDistillationPlugin", "EWCPlugin",
                     "SynapticIntelligencePlugin", "MASPlugin", "RWalkPlugin", "CWRStarPlugin"),
                    "the method protects earlier experiences itself, and its parameters grow with every "
                    "experience, so a distillation or regularisation term would not line up with them"),
    "LRSchedulerPlugin": "the strategy builds a fresh optimiser and schedule per experience (lr_schedule=); a "
                         "scheduler bound to another optimiser would be silently ignored",
    "FromScratchTrainingPlugin": "resetting the model would discard every component learned so far",
}


class LoRASumTemplate(ModelFirst, ShardedEvaluation, LoaderDefaults, PerExperienceCosine, MixedPrecision,
                      SupervisedTemplate):
    """A ``SupervisedTemplate`` for a :class:`LoRASumViT`, built from the method's config.

    Subclasses take the method's options as keyword arguments, build its config and call
    ``super().__init__`` with the model; they may override :meth:`prepare_component` and
    :meth:`conclude_component`.
    """

    model: LoRASumViT
    ddp_model: Optional[nn.Module] = None

    def __init__(self, *, model: LoRASumViT, config: Any, criterion: Optional[nn.Module],
                 device: Union[str, torch.device], plugins: Optional[Sequence[BasePlugin]],
                 evaluator: Union[EvaluationPlugin, Callable[[], EvaluationPlugin]], **kwargs: Any) -> None:
        name = type(self).__name__
        refuse_incompatible_plugins(name, plugins or (), REFUSED_PLUGINS)
        self.config = config
        self.loader_defaults = config.group(LoaderOptions)
        super().__init__(
            model=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=config.lr),  # replaced per experience
            criterion=nn.CrossEntropyLoss() if criterion is None else criterion,
            train_mb_size=config.train_mb_size, train_epochs=config.train_epochs,
            eval_mb_size=config.eval_mb_size, device=device,
            plugins=[DataChecksPlugin(scan_experiences=config.check_data), *(plugins or ())],
            evaluator=evaluator, eval_every=config.eval_every, **kwargs)

    # ------------------------------------------------------------------ per experience

    def check_model_and_optimizer(self, **kwargs: Any) -> None:
        components = self.model.num_experts
        self.model = self.model_adaptation()
        if self.model.num_experts != components:
            self.prepare_component(**kwargs)
        self.ddp_model = wrap_current_expert(self.model)
        if self.model.num_experts != components or not continues_experience(self.experience):
            self.make_optimizer(**kwargs)

    def prepare_component(self, **kwargs: Any) -> None:
        """After a new component is added, before its optimiser exists (InfLoRA designs ``A_t`` here)."""

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
        if config.lr_schedule == "cosine":
            self.restart_cosine()
        elif config.lr_schedule == "epoch_cosine":
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

    # ------------------------------------------------------------------ steps

    def forward(self) -> Tensor:
        model = self.ddp_model if self.is_training and self.ddp_model is not None else self.model
        return model(self.mb_x)

    def criterion(self) -> Tensor:
        """Training: the loss over the current experience's classes only. Evaluation: over every class."""
        if not self.is_training:
            return self._criterion(self.mb_output, self.mb_y)
        current = self.model.current_classes
        logits = self.mb_output[:, : len(current)].masked_fill(~current, float("-inf"))
        return self._criterion(logits, self.mb_y)
