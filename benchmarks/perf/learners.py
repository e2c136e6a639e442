"""The learners of CoLoR, S-Prompts, L2P, SD-LoRA (folded and unfolded) and InfLoRA, and :func:`learners`, a fresh
learner of every method by name (LoRA-Sub's and CL-LoRA's: :mod:`benchmarks.perf.learners_cvpr2025`)."""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
from torch import Tensor, nn

from avalanche_color import (ExpertViT, InfLoRAConfig, InfLoRAViT, L2PModelOptions, L2PViT, PromptExpertViT,
                             PromptOptions, RoutedExpertViT, SDLoRAConfig, SDLoRAViT)
from avalanche_color.peers.lora_sum.model import LoRASumViT, Mixing, input_covariances
from benchmarks.perf.learner import Learner, criterion, image_size, random_images
from benchmarks.perf.learners_cvpr2025 import peer_learners

L2P_SURROGATE_WEIGHT = 0.1  # L2PConfig's default


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
        with input_covariances(self.model.layers) as sums:
            self.model.features(random_images(experience, self.image_size, self.model.device))
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
    """A fresh learner of each method by name, on ``device``: CoLoR, SD-LoRA, InfLoRA, LoRA-Sub and CL-LoRA at
    ``rank`` (their other options their configs' defaults), S-Prompts and L2P with their own defaults (10
    prompt tokens per expert; a pool of 10 prompts of 5 tokens, 5 chosen per sample); and SD-LoRA unfolded
    (:class:`UnfoldedSDLoRAViT`), for comparison."""

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
        **peer_learners(make_vit, rank, classes, device),
    }


def settings(rank: int, k: int) -> str:
    """What :func:`learners` builds, in words."""
    prompts, pool = PromptOptions(), L2PModelOptions()
    return (f"CoLoR, SD-LoRA, InfLoRA, LoRA-Sub and CL-LoRA rank {rank} (LoRA-Sub and CL-LoRA otherwise their "
            "codes' defaults: LoRA-Sub's threshold 0.99, CL-LoRA's shared adapters on the first half of the blocks); "
            f"S-Prompts {prompts.prompt_length} prompt tokens per expert; "
            f"L2P a pool of {pool.pool_size} prompts of {pool.prompt_length} tokens, {pool.top_n} chosen per sample; "
            f"k {k} prototypes per expert (CoLoR, S-Prompts)")
