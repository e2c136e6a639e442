"""InfLoRA's model: W = W0 + sum_t B_t A_t on k and v of every block, each A_t designed and fixed.

What comes from where (InfLoRA paper, Liang & Li CVPR 2024, its method section; official code
liangyanshuo/InfLoRA, ``models/vit_inflora.py`` and ``methods/inflora.py``). The paper names
the designed dimensionality-reduction matrix B_t and the trained one A_t; the code (and this
module) the other way round: ``A_t`` (r x d) is designed and fixed, ``B_t`` (d x r) trains.

* LoRA on the key and value parts of every block's fused qkv (``Attention_LoRA``:
  ``lora_A_k``/``lora_B_k``, ``lora_A_v``/``lora_B_v``), one branch per task, the same ``A_t``
  for k and v, no scaling; rank 10 (``configs/cifar100_inflora.json``).
* Before task t: ``A_t`` from the task's input representation projected outside the protected
  subspace of earlier tasks (:func:`~avalanche_color.peers.inf_lora.subspace.design_reduction`);
  ``B_t`` starts at zero and is the only LoRA weight that trains.
* After task t: the protected subspaces grow by the task's inputs (DualGPM, threshold epsilon_t,
  :class:`~avalanche_color.peers.inf_lora.subspace.ProtectedSubspace`), and the task's branch is
  kept, frozen, summed with the others (as the code; merging it into W0 would give the same
  outputs).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import ClassVar

import torch
from torch import Tensor, nn

from avalanche_color.peers.inf_lora.config import InfLoRAConfig
from avalanche_color.peers.inf_lora.subspace import ProtectedSubspace, design_reduction
from avalanche_color.peers.lora_sum.layer import Mixing, Part
from avalanche_color.peers.lora_sum.model import LoRASumViT


class InfLoRAViT(LoRASumViT):
    """A frozen timm ViT with InfLoRA branches on k and v of every block and one head over all classes.

    Args:
        vit: a timm ``VisionTransformer``; the model adapts a copy.
        config: :class:`~avalanche_color.peers.inf_lora.config.InfLoRAConfig`.
    """

    parts: ClassVar[tuple[Part, Part]] = ("k", "v")
    config: InfLoRAConfig
    config_class: ClassVar[type[InfLoRAConfig]] = InfLoRAConfig

    def __init__(self, vit: nn.Module, config: InfLoRAConfig) -> None:
        super().__init__(vit, config)
        self.subspaces = nn.ModuleList(ProtectedSubspace(layer.in_features) for layer in self.layers)
        self.subspaces.to(self.device)

    def mixing(self) -> Mixing:
        training = self.training_component()  # every branch with coefficient 1; the one learning runs low-rank
        return Mixing(low_rank=frozenset(() if training is None else (training,)))

    def component_parameter_count(self, component: int) -> int:
        """Its B in every layer (A is designed, not trained)."""
        return sum(layer.components[component].B.numel() for layer in self.layers)

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        """The head, and the current branch's B (its A is designed, not trained)."""
        yield from super().trainable_parameters()
        training = self.training_component()
        if training is not None:
            for layer in self.layers:
                yield layer.components[training].B

    @torch.no_grad()
    def design_component(self, covariances: Sequence[Tensor]) -> None:
        """Set the current branch's ``A_t`` in every layer from the new task's input covariances."""
        for layer, subspace, covariance in zip(self.layers, self.subspaces, covariances):
            component = layer.components[-1]
            reduction = design_reduction(covariance, subspace, component.rank)
            component.A.copy_(reduction.to(component.A.dtype).expand_as(component.A))

    @torch.no_grad()
    def protect(self, covariances: Sequence[Tensor]) -> None:
        """Add the current task's inputs (its covariances) to every layer's protected subspace."""
        threshold = self.config.threshold_at(self.num_experts - 1)
        for subspace, covariance in zip(self.subspaces, covariances):
            subspace.update(covariance, threshold)
