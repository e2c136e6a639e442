"""LoRA subtraction's model: W = W0 + sum_{i<=t} B_i A_i on k and v of every block, and class-mean prototypes.

What comes from where (Liu & Chang, CVPR 2025; the authors' code scarlet0703/LoRA-Sub-DRS at
836ad29, ``models/vit_lora.py``, ``models/sinet_lora.py``, ``methods/lorasub_drs.py``):

* LoRA on the key and value parts of every block's fused qkv (``Attention_LoRA``: ``lora_A_k``,
  ``lora_B_k``, ``lora_A_v``, ``lora_B_v``), separate A and B for k and v, rank 10, no scaling, one
  component per task, all summed with coefficient 1; A and B of the current one train.
* Initialisation (``init_param``): A Kaiming-uniform (a = sqrt(5)), B ``nn.init.sparse_`` with
  sparsity 1 - 1/d: one N(0, 0.01^2) entry per column, so a new component changes the output at once.
* The subtracted network of task t (``get_cur_x=True``): ``W0 - sum_{i<t} B_i A_i``, the current
  component left out (:meth:`LoRASubtractionViT.subtracted_mixing`).
* One linear head per task over its classes (``classifier_pool``) for the cross-entropy: here the one
  growing head of the LoRA-sum family, its loss over the current classes only; the rows of a class
  that returns (a domain stream) are drawn afresh, as a new task's head would be.
* Evaluation by the nearest class mean (:func:`nearest_mean_logits`: ``argmin_c ||c/||c|| - f/(||f|| + 1e-8)||^2``,
  the code's ``_eval_model`` with scipy's ``cdist(..., 'sqeuclidean')``), one prototype per (class, experience)
  that trained it, never updated; the head is not used. The prototypes are computed by the strategy at each
  experience's end (:func:`~avalanche_color.peers.lora_sub.strategy.class_means`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import ClassVar, Union

import torch
from torch import Tensor, nn

from avalanche_color.experts.routed_vit import backbone_dtype, backbone_images
from avalanche_color.lora import expert_tokens
from avalanche_color.peers.lora_sub.config import LoRASubtractionConfig
from avalanche_color.peers.lora_sum.model import LoRASumViT, Mixing, Part
from avalanche_color.utils.rng import seeded
from avalanche_color.utils.state import take_stored_shapes

SPARSE_STD = 0.01  # nn.init.sparse_'s default, which the code keeps
GROWING = ("prototypes", "prototype_classes", "prototype_experiences", "projections")
FEATURE_EPS = 1e-8  # the code's EPSILON in f / (||f|| + eps)


class LoRASubtractionViT(LoRASumViT):
    """A frozen timm ViT with LoRA components on k and v of every block, a head for training, and
    class-mean prototypes for prediction.

    Buffers (in :meth:`experts_state_dict`): ``prototypes`` (p, d; float32 or wider),
    ``prototype_classes`` and ``prototype_experiences`` (p,), and ``projections`` (layers, d, d), each
    layer's ``P`` while an experience after the first trains (empty otherwise).

    Args:
        vit: a timm ``VisionTransformer``; the model adapts a copy.
        config: :class:`~avalanche_color.peers.lora_sub.config.LoRASubtractionConfig`.
    """

    parts: ClassVar[tuple[Part, Part]] = ("k", "v")
    config: LoRASubtractionConfig
    config_class: ClassVar[type[LoRASubtractionConfig]] = LoRASubtractionConfig
    prototypes: Tensor
    prototype_classes: Tensor
    prototype_experiences: Tensor
    projections: Tensor

    def __init__(self, vit: nn.Module, config: LoRASubtractionConfig) -> None:
        super().__init__(vit, config)
        width, device = int(self.backbone.num_features), self.device
        self.coefficient_dtype = torch.promote_types(backbone_dtype(self.backbone), torch.float32)
        self.register_buffer("prototypes", torch.zeros(0, width, dtype=self.coefficient_dtype, device=device))
        self.register_buffer("prototype_classes", torch.zeros(0, dtype=torch.long, device=device))
        self.register_buffer("prototype_experiences", torch.zeros(0, dtype=torch.long, device=device))
        inputs = self.layers[0].in_features
        self.register_buffer("projections", torch.zeros(0, inputs, inputs, dtype=torch.float64, device=device))

    # ------------------------------------------------------------------ components

    def _coefficients(self, values: Sequence[float]) -> list[Tensor]:
        # Explicit magnitudes in float32 or wider: the layer's default ones are float32, which would round
        # a float64 backbone's B to float32.
        return [torch.full((), v, dtype=self.coefficient_dtype, device=self.device) for v in values]

    def mixing(self) -> Mixing:
        """Every component with coefficient 1; the one learning runs low-rank."""
        training = self.training_component()
        return Mixing(magnitudes=self._coefficients([1.0] * self.num_experts),
                      low_rank=frozenset(() if training is None else (training,)))

    def subtracted_mixing(self) -> Mixing:
        """The subtracted network of the newest component's experience: every earlier component with
        coefficient -1, the newest one left out."""
        return Mixing(magnitudes=self._coefficients([-1.0] * (self.num_experts - 1) + [0.0]))

    def start_component(self, rank: int) -> None:
        super().start_component(rank)  # A Kaiming-uniform (a = sqrt(5)), as the code
        with torch.no_grad():
            for layer in self.layers:
                B = layer.components[-1].B
                for part in B:  # (d, r) per adapted part: one nonzero per column
                    nn.init.sparse_(part, sparsity=1 - 1 / part.shape[0], std=SPARSE_STD)

    def component_parameter_count(self, component: int) -> int:
        """Its A and B of k and v in every layer."""
        return sum(p.numel() for layer in self.layers for p in layer.components[component].parameters())

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        """The head, and the current component's A and B."""
        yield from super().trainable_parameters()
        training = self.training_component()
        if training is not None:
            for layer in self.layers:
                yield from layer.components[training].parameters()

    def learn_classes(self, classes: list[int]) -> None:
        # Only when a component starts: a resumed run or an online chunk continues its experience's head.
        starting = not len(self.finished) or bool(self.finished[-1])
        trained = self.trained_classes.tolist()  # one host read per experience
        returning = [c for c in classes if c < len(trained) and trained[c]]
        super().learn_classes(classes)
        if starting and returning:  # the code's fresh head per task: a returning class's rows start anew
            with seeded(int(self.config.init_seed) * 1_000_003 + 500_009 + self.num_experts), torch.no_grad():
                fresh = self.new_head_rows(self.head_weight.shape[1], len(returning))
                self.head_weight[returning] = fresh.weight.to(self.head_weight)
                self.head_bias[returning] = fresh.bias.to(self.head_bias)

    @torch.no_grad()
    def set_projections(self, projections: Sequence[Tensor]) -> None:
        """Each layer's ``P`` for the experience that trains now (none: its updates are not projected)."""
        inputs = self.projections.shape[-1]
        self.projections = (torch.stack([p.to(self.projections) for p in projections]) if len(projections)
                            else self.projections.new_zeros(0, inputs, inputs))

    @torch.no_grad()
    def add_prototypes(self, classes: Tensor, means: Tensor) -> None:
        """Store ``means`` (c, d) of ``classes`` (c,) as the current experience's prototypes."""
        classes = classes.to(self.prototype_classes)
        self.prototypes = torch.cat((self.prototypes, means.to(self.prototypes)))
        self.prototype_classes = torch.cat((self.prototype_classes, classes))
        self.prototype_experiences = torch.cat(
            (self.prototype_experiences, torch.full_like(classes, self.num_experts - 1)))

    # ------------------------------------------------------------------ forward

    def features(self, x: Tensor, mixing: Union[Mixing, None] = None) -> Tensor:
        """The pooled feature under ``mixing`` (default: every component summed, :meth:`mixing`)."""
        tokens = expert_tokens(self.backbone, backbone_images(self.backbone, x),
                               self.mixing() if mixing is None else mixing)
        return self.backbone.forward_head(tokens, pre_logits=True)

    def head_logits(self, features: Tensor) -> Tensor:
        """The training head's logits over every class id seen (``-inf`` for classes never trained)."""
        logits = nn.functional.linear(features.to(self.head_weight.dtype), self.head_weight, self.head_bias)
        logits = logits.masked_fill(~self.trained_classes, float("-inf"))
        missing = self.num_classes - logits.shape[1]
        return nn.functional.pad(logits, (0, missing), value=float("-inf")) if missing else logits

    def forward(self, x: Tensor, with_features: bool = False) -> Union[Tensor, tuple[Tensor, Tensor]]:
        """The nearest-mean logits over every class id seen (minus the squared distance of the normalised
        feature to the class's nearest normalised prototype; ``-inf`` for classes without one; zeros
        before any prototype exists). ``with_features``: instead, the training head's logits and the
        feature, what the training loss needs."""
        if with_features:
            features = self.features(x)
            return self.head_logits(features), features
        if not len(self.prototypes):  # before the first experience ends
            return x.new_zeros(x.shape[0], self.num_classes, dtype=self.prototypes.dtype)
        return nearest_mean_logits(self.features(x), self.prototypes, self.prototype_classes, self.num_classes)

    # ------------------------------------------------------------------ state

    def load_experts_state_dict(self, state: dict[str, Tensor]) -> None:
        take_stored_shapes(self, state, "", GROWING)
        super().load_experts_state_dict(state)


def nearest_mean_logits(features: Tensor, prototypes: Tensor, prototype_classes: Tensor, num_classes: int) -> Tensor:
    """(n, num_classes): minus the squared distance of each normalised feature to the nearest normalised
    prototype of each class (the class of the nearest prototype wins); ``-inf`` for a class without one.
    Computed in the prototypes' dtype."""
    f = features.to(prototypes.dtype)
    f = f / (f.norm(dim=1, keepdim=True) + FEATURE_EPS)
    centres = prototypes / prototypes.norm(dim=1, keepdim=True)
    squared = (f.square().sum(1, keepdim=True) + centres.square().sum(1)[None, :] - 2 * f @ centres.T).clamp(min=0)
    logits = f.new_full((len(f), num_classes), float("-inf"))
    index = prototype_classes[None, :].expand(len(f), -1)
    return logits.scatter_reduce(1, index, -squared, reduce="amax")
