"""Each method as the memory rows run it: experiences added without training them, and one training step.

A learner grows its model with the method's own calls, as its strategy does around each experience:
:meth:`Learner.start` is the strategy's model adaptation (a new expert, component or head rows, InfLoRA's
designed ``A_t``), :meth:`Learner.finish` what follows training (weights as if trained, prototypes,
InfLoRA's protected subspaces, the expert or component frozen). :meth:`Learner.optimizer` and
:meth:`Learner.loss` are the strategy's training step. Weights are random: memory does not depend on them.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar

import torch
from torch import Tensor, nn

from avalanche_color import (ExpertViT, InfLoRAConfig, InfLoRAViT, L2PModelOptions, L2PViT, PromptExpertViT,
                             PromptOptions, RoutedExpertViT, SDLoRAConfig, SDLoRAViT)
from avalanche_color.peers.lora_sum.covariances import input_covariances
from avalanche_color.peers.lora_sum.layer import Mixing
from avalanche_color.peers.lora_sum.model import LoRASumViT

L2P_SURROGATE_WEIGHT = 0.1  # L2PConfig's default
COVARIANCE_IMAGES = 2  # random images whose inputs stand for an experience's in InfLoRA's subspaces
criterion = nn.CrossEntropyLoss()


class Learner:
    """One method's model and training step; ``classes`` new classes per experience."""

    name: ClassVar[str]

    def __init__(self, model: nn.Module, classes: int) -> None:
        self.model, self.classes = model, classes

    def classes_of(self, experience: int) -> list[int]:
        return list(range(experience * self.classes, (experience + 1) * self.classes))

    def labels(self, experience: int, batch: int, generator: torch.Generator) -> Tensor:
        """Random labels among the classes of ``experience``."""
        return torch.randint(0, self.classes, (batch,), generator=generator) + experience * self.classes

    def start(self, experience: int) -> None:
        raise NotImplementedError

    def finish(self, experience: int) -> None:
        raise NotImplementedError

    def optimizer(self) -> torch.optim.Optimizer:
        raise NotImplementedError

    def loss(self, x: Tensor, labels: Tensor) -> Tensor:
        return criterion(self.model(x), labels)

    def learned_state(self) -> dict[str, Tensor]:
        """Everything learned, no backbone weight: what a checkpoint keeps."""
        return self.model.experts_state_dict()


class RoutedLearner(Learner):
    """CoLoR and S-Prompts: one expert and head per experience, ``k`` prototypes each; SGD over the new one."""

    model: RoutedExpertViT

    def __init__(self, model: RoutedExpertViT, classes: int, k: int) -> None:
        super().__init__(model, classes)
        self.k = k

    def start(self, experience: int) -> None:
        self.model.start_expert(self.classes_of(experience), experience)

    @torch.no_grad()
    def finish(self, experience: int) -> None:
        model = self.model
        for module in model.bank.expert_modules(experience):
            if isinstance(getattr(module, "B", None), nn.Parameter):  # LoRA: as if trained, B != 0
                module.B.normal_(0, 0.02)
        centres = nn.functional.normalize(torch.randn(self.k, model.num_features), dim=-1)
        model.router.set_prototypes(experience, centres)
        model.finish_expert(experience)

    def optimizer(self) -> torch.optim.Optimizer:
        # The template's: momentum is the only state (weight decay and the cosine schedule keep none).
        trainable = self.model.bank.trainable
        if trainable is None:
            raise RuntimeError("no expert trains: start an experience first")
        return torch.optim.SGD(self.model.expert_parameters(trainable), lr=1e-3, momentum=0.9)


class CoLoRLearner(RoutedLearner):
    name = "CoLoR"


class SPromptsLearner(RoutedLearner):
    name = "S-Prompts"


class L2PLearner(Learner):
    """L2P: one shared prompt pool, one head whose rows grow; Adam over both, the surrogate loss on the keys."""

    name = "L2P"
    model: L2PViT

    def start(self, experience: int) -> None:
        self.model.learn_classes(self.classes_of(experience))

    def finish(self, experience: int) -> None:
        """Nothing is frozen or added after an experience."""

    def optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(list(self.model.trainable_parameters()), lr=0.03)

    def loss(self, x: Tensor, labels: Tensor) -> Tensor:
        query, selection = self.model.select_prompts(x)
        loss = criterion(self.model(x, selection), labels)
        return loss + L2P_SURROGATE_WEIGHT * self.model.pool.surrogate_loss(query, selection)

    def learned_state(self) -> dict[str, Tensor]:
        """L2P has no experts_state_dict: its state_dict without the frozen backbone."""
        return {k: v for k, v in self.model.state_dict().items() if not k.startswith("backbone.")}


class LoRASumLearner(Learner):
    """SD-LoRA and InfLoRA: one component per experience summed into the shared ViT, one growing head."""

    model: LoRASumViT

    def start(self, experience: int) -> None:
        self.model.learn_classes(self.classes_of(experience))

    @torch.no_grad()
    def finish(self, experience: int) -> None:
        for layer in self.model.layers:  # as if trained: B != 0
            layer.components[-1].B.normal_(0, 0.02)
        self.model.finish_component()

    def optimizer(self) -> torch.optim.Optimizer:
        # LoRASumTemplate.make_optimizer's choice (its cosine schedule keeps no state).
        config, trainable = self.model.config, list(self.model.trainable_parameters())
        if config.optimizer == "sgd":
            return torch.optim.SGD(trainable, lr=config.lr, momentum=config.momentum)
        return torch.optim.Adam(trainable, lr=config.lr, betas=(0.9, 0.999))


class SDLoRALearner(LoRASumLearner):
    name = "SD-LoRA"


class UnfoldedSDLoRAViT(SDLoRAViT):
    """SD-LoRA with every direction computed low-rank over the tokens, none folded into the weight: the
    same outputs, and what keeping each earlier direction in the training graph per sample costs."""

    def mixing(self) -> Mixing:
        return dataclasses.replace(super().mixing(), low_rank=frozenset(range(self.num_experts)))


class UnfoldedSDLoRALearner(SDLoRALearner):
    name = "SD-LoRA, unfolded"


class InfLoRALearner(LoRASumLearner):
    """InfLoRA: before each experience ``A_t`` is designed outside the protected subspaces, after it the
    subspaces grow by its inputs (here: those of ``COVARIANCE_IMAGES`` random images per experience,
    measured once, before training, and used for both)."""

    name = "InfLoRA"
    model: InfLoRAViT

    def __init__(self, model: InfLoRAViT, classes: int, image_size: tuple[int, int]) -> None:
        super().__init__(model, classes)
        self.image_size = image_size
        self.covariances: list[Tensor] = []

    @torch.no_grad()
    def start(self, experience: int) -> None:
        super().start(experience)
        generator = torch.Generator().manual_seed(experience)
        images = torch.randn(COVARIANCE_IMAGES, 3, *self.image_size, generator=generator).to(self.model.device)
        with input_covariances(self.model.layers) as sums:
            self.model.features(images)
        self.covariances = [total.mean() for total in sums]
        self.model.design_component(self.covariances)

    @torch.no_grad()
    def finish(self, experience: int) -> None:
        for layer in self.model.layers:
            layer.components[-1].B.normal_(0, 0.02)
        self.model.protect(self.covariances)
        self.model.finish_component()


def learners(make_vit: Callable[[], nn.Module], rank: int, k: int, classes: int,
             device: torch.device) -> dict[str, Callable[[], Learner]]:
    """A fresh learner of each method by name, on ``device``: CoLoR, SD-LoRA and InfLoRA at ``rank``,
    S-Prompts and L2P with their own defaults (10 prompt tokens per expert; a pool of 10 prompts of 5
    tokens, 5 chosen per sample); and SD-LoRA unfolded (:class:`UnfoldedSDLoRAViT`), for comparison."""

    def image_size(vit: nn.Module) -> tuple[int, int]:
        return tuple(vit.patch_embed.img_size)  # type: ignore[return-value]

    def inf_lora() -> Learner:
        vit = make_vit()
        return InfLoRALearner(InfLoRAViT(vit, InfLoRAConfig(rank=rank)).to(device), classes, image_size(vit))

    return {
        CoLoRLearner.name: lambda: CoLoRLearner(ExpertViT(make_vit(), rank=rank).to(device), classes, k),
        SPromptsLearner.name: lambda: SPromptsLearner(PromptExpertViT(make_vit()).to(device), classes, k),
        L2PLearner.name: lambda: L2PLearner(L2PViT(make_vit()).to(device), classes),
        SDLoRALearner.name: lambda: SDLoRALearner(SDLoRAViT(make_vit(), SDLoRAConfig(rank=rank)).to(device), classes),
        UnfoldedSDLoRALearner.name: lambda: UnfoldedSDLoRALearner(
            UnfoldedSDLoRAViT(make_vit(), SDLoRAConfig(rank=rank)).to(device), classes),
        InfLoRALearner.name: inf_lora,
    }


def settings(rank: int, k: int) -> str:
    """What :func:`learners` builds, in words."""
    prompts, pool = PromptOptions(), L2PModelOptions()
    return (f"CoLoR, SD-LoRA and InfLoRA rank {rank}; S-Prompts {prompts.prompt_length} prompt tokens per expert; "
            f"L2P a pool of {pool.pool_size} prompts of {pool.prompt_length} tokens, {pool.top_n} chosen per sample; "
            f"k {k} prototypes per expert (CoLoR, S-Prompts)")
