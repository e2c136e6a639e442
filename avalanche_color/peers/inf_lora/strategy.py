"""InfLoRA as an Avalanche strategy (Liang & Li, "InfLoRA: Interference-Free Low-Rank Adaptation for
Continual Learning", CVPR 2024; code liangyanshuo/InfLoRA).

The model and each choice with its source, its protected subspaces included:
:mod:`avalanche_color.peers.inf_lora.model`. Training, from ``methods/inflora.py``: before
the task, one pass over its training data (the training loader, no gradients) measures each
layer's inputs and designs ``A_t``; the task trains ``B_t`` and the classifier with the
cross-entropy over its own classes' logits (the code's current ``classifier_pool`` entry
against ``targets - known_classes``); after it, a second pass with the trained branch updates
the protected subspaces. Evaluation uses one classifier over all classes seen (the code's
``interface`` concatenates every task's classifier), one forward per sample, nothing routed.
Our choices: the passes run over the experience's whole training data on every rank under
torchrun (identical subspaces everywhere, no reduction needed), and leave the random
generators as they were.
"""

from collections.abc import Sequence
from typing import Any, ClassVar, Optional, Union

import torch
from avalanche.benchmarks.utils.data_loader import collate_from_data_or_kwargs
from avalanche.core import BasePlugin
from avalanche.training.plugins.evaluation import default_evaluator
from torch import Tensor, nn

from avalanche_color.config import Precision
from avalanche_color.peers.inf_lora.config import InfLoRAConfig, Optimizer, Schedule
from avalanche_color.peers.inf_lora.model import InfLoRAViT
from avalanche_color.peers.lora_sum.model import input_covariances
from avalanche_color.peers.lora_sum.strategy import LoRASumTemplate
from avalanche_color.training.loaders import data_loader, loader_options
from avalanche_color.training.strategy import Evaluator
from avalanche_color.utils.experiences import origin_experience
from avalanche_color.utils.rng import generators_untouched


class InfLoRA(LoRASumTemplate):
    """InfLoRA on any timm ViT: each experience's LoRA trains only outside its predecessors' inputs.

    ``W = W0 + sum_t B_t A_t`` on the key and value projections of every block. Before experience
    t, ``A_t`` is set to the top directions of its inputs outside the subspace protected for
    earlier experiences and fixed; only ``B_t`` (and the classifier) trains, so the layer's output
    on protected inputs does not change. Defaults: the official code's Split CIFAR-100 run;
    ``eval_mb_size`` is also the batch size of the input passes.
    """

    model: InfLoRAViT
    config: InfLoRAConfig
    config_class: ClassVar[type[InfLoRAConfig]] = InfLoRAConfig
    model_class: ClassVar[type[InfLoRAViT]] = InfLoRAViT
    model_config_class: ClassVar[type[InfLoRAConfig]] = InfLoRAConfig

    def __init__(
        self,
        model: nn.Module,
        config: Optional[InfLoRAConfig] = None,
        *,
        rank: int = InfLoRAConfig.rank,
        threshold: float = InfLoRAConfig.threshold,
        final_threshold: float = InfLoRAConfig.final_threshold,
        num_experiences: Optional[int] = InfLoRAConfig.num_experiences,
        optimizer: Optimizer = InfLoRAConfig.optimizer,
        lr: float = InfLoRAConfig.lr,
        lr_schedule: Schedule = InfLoRAConfig.lr_schedule,
        # LoRASumTraining
        momentum: float = InfLoRAConfig.momentum,
        weight_decay: float = InfLoRAConfig.weight_decay,
        train_epochs: int = InfLoRAConfig.train_epochs,
        init_seed: int = InfLoRAConfig.init_seed,
        # TrainingOptions
        train_mb_size: int = InfLoRAConfig.train_mb_size,
        eval_mb_size: int = InfLoRAConfig.eval_mb_size,
        eval_every: int = InfLoRAConfig.eval_every,
        check_data: bool = InfLoRAConfig.check_data,
        # PrecisionOptions
        precision: Precision = InfLoRAConfig.precision,
        # LoaderOptions
        num_workers: int = InfLoRAConfig.num_workers,
        pin_memory: Optional[bool] = InfLoRAConfig.pin_memory,
        persistent_workers: bool = InfLoRAConfig.persistent_workers,
        # Avalanche's (StrategyBase)
        criterion: Optional[nn.Module] = None,
        device: Union[str, torch.device] = "cpu",
        plugins: Optional[Sequence[BasePlugin]] = None,
        evaluator: Evaluator = default_evaluator,
        **template_options: Any,
    ) -> None:
        """InfLoRA on ``model``, with the options of ``config`` and those given here (the others: their
        defaults).

        Each option (``rank`` to ``persistent_workers``) is a field of
        :class:`~avalanche_color.peers.inf_lora.config.InfLoRAConfig`, documented there; its default is the
        config's. ``criterion``, ``device``, ``plugins``, ``evaluator`` and Avalanche's other keywords: as
        :class:`~avalanche_color.training.strategy.StrategyBase` says.

        Args:
            model: a timm ``VisionTransformer``, of which the strategy builds its
                :class:`~avalanche_color.peers.inf_lora.model.InfLoRAViT` on a copy (the ViT given stays as it was);
                or a :class:`~avalanche_color.peers.inf_lora.model.InfLoRAViT` (a strategy's ``model``) to continue
                from: its own settings (``rank``, ``threshold``, ``final_threshold``, ``num_experiences``) then
                apply, and one given another value is refused.
            config: all options as one :class:`~avalanche_color.peers.inf_lora.config.InfLoRAConfig`; an option
                given here replaces its field.
        """
        options = dict(
            rank=rank, threshold=threshold, final_threshold=final_threshold, num_experiences=num_experiences,
            optimizer=optimizer, lr=lr, lr_schedule=lr_schedule, momentum=momentum, weight_decay=weight_decay,
            train_epochs=train_epochs, init_seed=init_seed, train_mb_size=train_mb_size, eval_mb_size=eval_mb_size,
            eval_every=eval_every, check_data=check_data, precision=precision, num_workers=num_workers,
            pin_memory=pin_memory, persistent_workers=persistent_workers)
        super().__init__(model=model, config=config, options=options, criterion=criterion, device=device,
                         plugins=plugins, evaluator=evaluator, template_options=template_options)

    def prepare_experience(self, **kwargs: Any) -> None:
        """Design the new branch's ``A_t`` from the experience's inputs outside the protected subspaces."""
        covariances = self.experience_covariances(**kwargs)
        bad = [index for index, covariance in enumerate(covariances) if not bool(torch.isfinite(covariance).all())]
        if bad:
            raise FloatingPointError(
                f"the inputs of the adapted layers {bad[:6]} became non-finite over experience "
                f"{self.experience.current_experience}'s training data, while designing its A_t (before iteration "
                f"0); stopped before any training step. Likely cause: pixels too large for the backbone "
                f"(normalise the images) or bad data")
        self.model.design_component(covariances)

    def conclude_component(self, **kwargs: Any) -> None:
        """Protect the experience's inputs, measured with its trained branch."""
        self.model.protect(self.experience_covariances(**kwargs))

    @torch.no_grad()
    def experience_covariances(self, **kwargs: Any) -> list[Tensor]:
        """Each LoRA'd layer's input representation over the experience's training data."""
        dataset = origin_experience(self.experience).dataset.train()  # an online chunk's whole experience
        collate: dict[str, Any] = {}
        collate_from_data_or_kwargs(dataset, collate)
        loader = data_loader(dataset, loader_options(kwargs, self.config), self.device,
                             batch_size=self.eval_mb_size, **collate)
        was_training = self.model.training
        self.model.eval()
        try:
            with generators_untouched(), input_covariances(self.model.layers) as sums:
                for batch in loader:
                    self.model.features(batch[0].to(self.device))
        finally:
            self.model.train(was_training)
        return [total.mean() for total in sums]
