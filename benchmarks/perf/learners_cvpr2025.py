"""The learners of the two CVPR 2025 methods, LoRA subtraction and CL-LoRA, and :func:`peer_learners`, a fresh one
of each by name."""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor, nn

from avalanche_color import CLLoRAConfig, CLLoRAViT, LoRASubtractionConfig, LoRASubtractionViT
from avalanche_color.peers.cl_lora.strategy import (distillation_loss, orthogonality_loss, set_gradients,
                                                    two_step_gradients)
from avalanche_color.peers.lora_sub.strategy import ProjectedAdam, augmented_triplet_loss, principal_projection
from avalanche_color.peers.lora_sum.model import input_covariances
from benchmarks.perf.learner import Learner, criterion, image_size, random_images


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
