"""SD-LoRA's model: W = W0 + sum_i alpha_i B_i A_i / ||B_i A_i||_F on q and v of every block.

What comes from where (SD-LoRA paper, Wu et al. ICLR 2025, its method section; official code
WuYichen-97/SD-Lora-CL, ``backbone/lora.py`` and ``models/sdlora.py``):

* LoRA on the query and value parts of every block's fused qkv (``LoRA_ViT_timm``:
  ``linear_a_q``/``linear_b_q`` and ``..._v``), rank 10 (``update_network``), A Kaiming-uniform
  and B zeros (``reset_parameters``), no alpha/r scaling: the magnitude scales.
* One magnitude alpha_i per component, a scalar shared by all blocks and by q and v
  (``wrapped_param``/``wrapped_param_prev``), starting at 0.8.
* The component being learned is ``alpha_t B_t A_t``, not normalised (the code's
  ``_LoRA_qkv_timm_train``; with B starting at zero its norm is zero). Once its experience is
  finished its direction is frozen and normalised per layer and part: ``B_i A_i / ||B_i A_i||_F``
  (the paper's normalised direction; ``direction_norm="factors"`` divides by ``||B_i||_F ||A_i||_F``
  as the code does). Every alpha, old and new, keeps learning in each later experience. So when an
  experience ends, its update changes from ``alpha_t B_t A_t`` to ``alpha_t B_t A_t / ||B_t A_t||_F``
  (one magnitude for all layers cannot keep every layer's scale); the code does the same.
* Our choice where the code differs from the paper's description: the code rebuilds its model
  for every task, so earlier magnitudes restart at 0.8; here they continue from their learned
  values (the paper's "magnitudes keep learning").
* SD-LoRA-RR (the paper's rank-reduction variant) is ``rank_schedule``: the code's commented
  schedule is ``(10, 10, 10, 10, 8, 8, 8, 8, 6)``. SD-LoRA-KD (folding a new direction into
  earlier ones by least squares) is not implemented.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import torch
from torch import nn

from avalanche_color.peers.lora_sum.layer import Mixing, Part
from avalanche_color.peers.lora_sum.model import LoRASumViT
from avalanche_color.peers.sd_lora.config import SDLoRAConfig


class SDLoRAViT(LoRASumViT):
    """A frozen timm ViT with SD-LoRA components on q and v of every block and one head over all classes.

    Args:
        vit: a timm ``VisionTransformer``; the model adapts a copy.
        config: :class:`~avalanche_color.peers.sd_lora.config.SDLoRAConfig`.
    """

    parts: ClassVar[tuple[Part, Part]] = ("q", "v")
    config: SDLoRAConfig
    config_class: ClassVar[type[SDLoRAConfig]] = SDLoRAConfig

    def __init__(self, vit: nn.Module, config: SDLoRAConfig) -> None:
        super().__init__(vit, config)
        self.magnitudes = nn.ParameterList()

    def mixing(self) -> Mixing:
        training = self.training_component()
        return Mixing(magnitudes=list(self.magnitudes), normalised=self.finished.tolist(),
                      norm=self.config.direction_norm, low_rank=frozenset(() if training is None else (training,)))

    def next_rank(self) -> int:
        return self.config.rank_of(self.num_experts)

    def start_component(self, rank: int) -> None:
        super().start_component(rank)
        weight = self.head_weight
        self.magnitudes.append(nn.Parameter(torch.full((), self.config.magnitude_init, dtype=weight.dtype,
                                                       device=weight.device)))

    def component_parameter_count(self, component: int) -> int:
        """Its A and B in every layer, and the magnitude of every direction so far (all of them learn)."""
        factors = sum(p.numel() for layer in self.layers for p in layer.components[component].parameters())
        return factors + component + 1

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        """The head, every magnitude, and the current direction's A and B."""
        yield from super().trainable_parameters()
        yield from self.magnitudes
        training = self.training_component()
        if training is not None:
            for layer in self.layers:
                yield from layer.components[training].parameters()
