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

from __future__ import annotations

from typing import Any, ClassVar

import torch
from avalanche.benchmarks.utils.data_loader import collate_from_data_or_kwargs
from torch import Tensor

from avalanche_color.peers.inf_lora.config import InfLoRAConfig
from avalanche_color.peers.inf_lora.model import InfLoRAViT
from avalanche_color.peers.lora_sum.model import input_covariances
from avalanche_color.peers.lora_sum.strategy import LoRASumTemplate
from avalanche_color.training.loaders import data_loader, loader_options
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
