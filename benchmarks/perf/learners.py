"""Each method as the memory and timing rows run it: experiences added without training them, and one training step.

A learner grows its model with the method's own calls, as its strategy does around each experience:
:meth:`Learner.start` is the strategy's model adaptation (a new expert, component or head rows, InfLoRA's
designed ``A_t``, LoRA subtraction's projections), :meth:`Learner.finish` what follows training (weights as
if trained, prototypes, InfLoRA's protected subspaces, the expert or component frozen).
:meth:`Learner.optimizer` and :meth:`Learner.step` are the strategy's training step (:meth:`Learner.loss`
and one backward, except CL-LoRA's two gradients and two optimiser steps). Weights are random: memory and
time do not depend on them.

The base class, then one learner per method: CoLoR and S-Prompts, L2P, SD-LoRA (folded and unfolded), InfLoRA,
and the two CVPR 2025 methods, LoRA subtraction and CL-LoRA; :func:`learners` builds a fresh one of each by name
(:func:`peer_learners` those two alone).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar, Optional

import torch
from torch import Tensor, nn

from avalanche_color import (CLLoRAConfig, CLLoRAViT, ExpertViT, InfLoRAConfig, InfLoRAViT, L2PModelOptions, L2PViT,
                             LoRASubtractionConfig, LoRASubtractionViT, PromptExpertViT, PromptOptions,
                             RoutedExpertViT, SDLoRAConfig, SDLoRAViT)
from avalanche_color.peers.cl_lora.strategy import (distillation_loss, orthogonality_loss, set_gradients,
                                                    two_step_gradients)
from avalanche_color.peers.lora_sub.strategy import ProjectedAdam, augmented_triplet_loss, principal_projection
from avalanche_color.peers.lora_sum.model import LoRASumViT, Mixing, input_covariances

COVARIANCE_IMAGES = 2  # random images whose inputs stand for an experience's (InfLoRA's subspaces, LoRA-Sub's P)
L2P_SURROGATE_WEIGHT = 0.1  # L2PConfig's default
criterion = nn.CrossEntropyLoss()


def random_images(experience: int, image_size: tuple[int, int], device: torch.device) -> Tensor:
    """``COVARIANCE_IMAGES`` random images, the same for an experience whichever method draws them."""
    generator = torch.Generator().manual_seed(experience)
    return torch.randn(COVARIANCE_IMAGES, 3, *image_size, generator=generator).to(device)


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

    def step(self, optimizer: torch.optim.Optimizer, x: Tensor, labels: Tensor) -> None:
        """One training step of the strategy: gradients cleared, the loss's backward, the optimiser's step."""
        optimizer.zero_grad(set_to_none=True)
        self.loss(x, labels).backward()
        optimizer.step()

    def learned_state(self) -> dict[str, Tensor]:
        """Everything learned, no backbone weight: what a checkpoint keeps."""
        return self.model.experts_state_dict()


def grown(learner: Learner, experiences: int) -> Learner:
    """``learner`` after ``experiences`` experiences, the last one being learned (``experiences - 1`` finished)."""
    for experience in range(experiences):
        if experience:
            learner.finish(experience - 1)
        learner.start(experience)
    return learner


def image_size(vit: nn.Module) -> tuple[int, int]:
    return tuple(vit.patch_embed.img_size)  # type: ignore[return-value]


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


class LoRASubLearner(Learner):
    """LoRA subtraction: one component per experience summed into the shared ViT (k and v), a growing head for
    training, one prototype per class for prediction. From experience 1 on, before training, each block's
    ``P`` from its inputs through the subtracted network (here: those of ``COVARIANCE_IMAGES`` random images),
    held until the experience ends; its projected Adam; the loss the strategy's: the cross-entropy over the
    experience's classes plus the triplet loss against the stored prototypes; prediction by the nearest mean."""

    name = "LoRA-Sub"
    model: LoRASubtractionViT

    def __init__(self, model: LoRASubtractionViT, classes: int, image_size: tuple[int, int]) -> None:
        super().__init__(model, classes)
        self.image_size = image_size

    @torch.no_grad()
    def start(self, experience: int) -> None:
        """The strategy's adaptation and ``prepare_experience``: a component, head rows, then ``P``."""
        model = self.model
        model.learn_classes(self.classes_of(experience))
        if model.num_experts < 2 or model.config.threshold == 1.0:
            model.set_projections([])
            return
        mixing, was_training = model.subtracted_mixing(), model.training
        model.eval()
        with input_covariances(model.layers) as sums:
            model.features(random_images(experience, self.image_size, model.device), mixing)
        model.train(was_training)
        model.set_projections([principal_projection(total.mean(), model.config.threshold)[0] for total in sums])

    @torch.no_grad()
    def finish(self, experience: int) -> None:
        """The strategy's ``conclude_component``: its classes' prototypes (random: as if measured), no ``P``;
        then the component frozen."""
        model = self.model
        for layer in model.layers:  # as if trained: B moved away from its sparse init
            layer.components[-1].B.normal_(0, 0.02)
        classes = torch.tensor(self.classes_of(experience), device=model.device)
        model.add_prototypes(classes, torch.randn(len(classes), model.prototypes.shape[1], device=model.device))
        model.set_projections([])
        model.finish_component()

    def optimizer(self) -> torch.optim.Optimizer:
        """LoRASubtraction.make_optimizer's: its projected Adam, the current A and B at ``lr``, the head at
        ``head_lr``, every update of A and B projected by ``P`` once there is one (its schedule keeps no state)."""
        config, model = self.model.config, self.model
        head = [model.head_weight, model.head_bias]
        lora = [p for p in model.trainable_parameters() if all(p is not h for h in head)]
        optimizer = ProjectedAdam([{"params": lora, "lr": config.lr}, {"params": head, "lr": config.head_lr}],
                                  weight_decay=config.weight_decay)
        training = model.training_component()
        if len(model.projections) and training is not None:
            for layer, projection in zip(model.layers, model.projections):
                optimizer.project(layer.components[training].A, projection, "right")
                optimizer.project(layer.components[training].B, projection, "left")
        return optimizer

    def loss(self, x: Tensor, labels: Tensor) -> Tensor:
        """LoRASubtraction's training loss: the head's cross-entropy over the current classes plus
        ``triplet_weight`` times the augmented triplet loss of the normalised features against the prototypes."""
        model, config = self.model, self.model.config
        logits, features = model(x, with_features=True)
        current = model.current_classes
        loss = criterion(logits[:, : len(current)].masked_fill(~current, float("-inf")), labels)
        features = features.to(torch.promote_types(features.dtype, torch.float32))
        normalised = features / features.norm(dim=1, keepdim=True)
        triplet = augmented_triplet_loss(normalised, labels, model.prototypes, model.prototype_classes,
                                         config.margin, config.same_class_prototypes)
        return loss + config.triplet_weight * triplet


class CLLoRALearner(Learner):
    """CL-LoRA: shared adapters on the first blocks for the whole stream, per experience new adapters and block
    weights on the others and a proxy head; its SGD. From experience 1 on, a training step is the strategy's:
    the training forward, the teacher's forward through the shared blocks (no gradient), the distillation
    and the orthogonality term, two gradients (:func:`two_step_gradients`) and two SGD steps. Prediction:
    the shared blocks once, the task-specific blocks once per experience learned, against the prototypes."""

    name = "CL-LoRA"
    model: CLLoRAViT

    def start(self, experience: int) -> None:
        """The model's adaptation: new adapters, block weights and proxy head; what trains set."""
        self.model.start_experience(self.classes_of(experience))
        self.model.set_trainable()

    @torch.no_grad()
    def finish(self, experience: int) -> None:
        """As if trained (U's != 0), the prototypes (random: as if measured), then the experience frozen and
        the shared U's the next teacher."""
        model = self.model
        for adapter in [*model.adapters.shared, *model.adapters.specific[experience]]:
            adapter.up.normal_(0, 0.02)
        classes = len(model.experiences.class_ids(experience))
        features = model.experiences.prototypes.shape[1]
        model.experiences.set_prototypes(experience, torch.randn(classes, features, device=model.device))
        model.finish_experience()

    def optimizer(self) -> torch.optim.Optimizer:
        """CLLoRA.make_optimizer's SGD (its per-epoch cosine keeps no state)."""
        config = self.model.config
        return torch.optim.SGD(list(self.model.trainable_parameters()), lr=config.lr, momentum=config.momentum,
                               weight_decay=config.weight_decay)

    def losses(self, x: Tensor, labels: Tensor) -> tuple[Tensor, Optional[Tensor]]:
        """CLLoRA's forward and criterion: (cross-entropy plus the orthogonality term, the distillation loss;
        None in the first experience, which has no teacher)."""
        model, config = self.model, self.model.config
        e = model.training_experience()
        if e is None:
            raise RuntimeError("no experience is being learned: start one first")
        outputs = model.training_outputs(x)
        loss = criterion(outputs.logits, labels)
        if e == 0:
            return loss, None
        with torch.no_grad():
            teacher = model.teacher_features(x)
        heads, weights = model.experiences, model.adapters.block_weights
        kd_loss = config.kd_weight * distillation_loss(heads.proxy_logits(outputs.shared_features, e),
                                                       heads.proxy_logits(teacher, e), config.kd_temperature)
        return loss + config.ortho_weight * orthogonality_loss(list(weights[:e]), weights[e]), kd_loss

    def loss(self, x: Tensor, labels: Tensor) -> Tensor:
        return self.losses(x, labels)[0]

    def step(self, optimizer: torch.optim.Optimizer, x: Tensor, labels: Tensor) -> None:
        """CLLoRA's ``backward`` and ``optimizer_step``: from experience 1 on, both gradients at the batch's
        parameters, SGD's step on the reassigned distillation gradient, then on the loss's."""
        optimizer.zero_grad(set_to_none=True)
        loss, kd_loss = self.losses(x, labels)
        if kd_loss is None:
            loss.backward()
            optimizer.step()
            return
        parameters, bank = list(self.model.trainable_parameters()), self.model.adapters
        first, second = two_step_gradients(parameters, loss, kd_loss, [adapter.up for adapter in bank.shared],
                                           bank.teacher_up)
        set_gradients(parameters, first)
        optimizer.step()
        set_gradients(parameters, second)
        optimizer.step()


def peer_learners(make_vit: Callable[[], nn.Module], rank: int, classes: int,
                  device: torch.device) -> dict[str, Callable[[], Learner]]:
    """A fresh LoRA-Sub and CL-LoRA learner by name, on ``device``, at ``rank``, their configs' other defaults."""

    def lora_sub() -> Learner:
        vit = make_vit()
        model = LoRASubtractionViT(vit, LoRASubtractionConfig(rank=rank)).to(device)
        return LoRASubLearner(model, classes, image_size(vit))

    return {
        LoRASubLearner.name: lora_sub,
        CLLoRALearner.name: lambda: CLLoRALearner(CLLoRAViT(make_vit(), CLLoRAConfig(rank=rank)).to(device), classes),
    }


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
