"""SD-LoRA's model: W = W0 + sum_{i<t} alpha_i B_i A_i / (||B_i||_F ||A_i||_F) + alpha_t B_t A_t on q and v.

What comes from where (SD-LoRA paper, Wu et al. ICLR 2025, its method section; official code
WuYichen-97/SD-Lora-CL at 8bacded, ``backbone/lora.py`` and ``models/sdlora.py``):

* LoRA on the query and value parts of every block's fused qkv (``LoRA_ViT_timm``:
  ``linear_a_q``/``linear_b_q`` and ``..._v``), rank 10 (``update_network``), A Kaiming-uniform
  and B zeros (``reset_parameters``), no alpha/r scaling: the magnitude scales.
* One magnitude alpha_i per component, a scalar shared by all blocks and by q and v
  (``wrapped_param``/``wrapped_param_prev``), starting at 0.8.
* The component being learned, and the newest one until the next experience starts, is
  ``alpha_t B_t A_t``, not normalised (``_LoRA_qkv_timm_train``): the evaluation after experience t,
  the last one included, scores the network as trained. Every earlier direction is frozen and
  divided per layer and part by ``||B_i||_F ||A_i||_F``, the code's norm
  (``direction_norm="product"``: ``||B_i A_i||_F``, the paper's notation;
  ``normalise_when="finish"``: normalised as soon as its experience ends).
* The code rebuilds its model when a task starts (``update_network``), so every earlier magnitude
  restarts at 0.8 and learns again in each experience (``earlier_magnitudes="keep"``: they continue
  from their learned values, the paper's "magnitudes keep learning").
* The one classifier grows per task, old rows kept (``IncrementalNet.update_fc``); new rows as the
  code's ``SimpleLinear`` (``backbone/linears.py``): Kaiming-uniform weights with gain 1, zero bias
  (``head_init="linear"``: ``nn.Linear``'s default).
* SD-LoRA-RR (the paper's rank-reduction variant) is ``rank_schedule``: the code's commented
  schedule is ``(10, 10, 10, 10, 8, 8, 8, 8, 6)``. SD-LoRA-KD (folding a new direction into
  earlier ones by least squares) is not implemented.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import torch
from torch import nn

from avalanche_color.peers.lora_sum.model import LoRASumViT, Mixing, Part
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
        return Mixing(magnitudes=list(self.magnitudes), normalised=self.normalised_components(),
                      norm=self.config.direction_norm, low_rank=frozenset(() if training is None else (training,)))

    def normalised_components(self) -> list[bool]:
        """Per component, whether its direction is divided by its norm: every one but the newest (the
        code), or every finished one (``normalise_when="finish"``)."""
        if self.config.normalise_when == "finish":
            return self.finished_components()
        return [i < self.num_experts - 1 for i in range(self.num_experts)]

    def next_rank(self) -> int:
        return self.config.rank_of(self.num_experts)

    def start_component(self, rank: int) -> None:
        super().start_component(rank)
        if self.config.earlier_magnitudes == "restart":  # the code's new network for every task
            with torch.no_grad():
                for magnitude in self.magnitudes:
                    magnitude.fill_(self.config.magnitude_init)
        weight = self.head_weight  # in trained_dtype: float32 beside a bfloat16 backbone
        self.magnitudes.append(nn.Parameter(torch.full((), self.config.magnitude_init, dtype=weight.dtype,
                                                       device=weight.device)))

    def component_parameter_count(self, component: int) -> int:
        """Its A and B in every layer, and the magnitude of every direction so far (all of them learn)."""
        factors = sum(p.numel() for layer in self.layers for p in layer.components[component].parameters())
        return factors + component + 1

    def new_head_rows(self, width: int, count: int) -> nn.Linear:
        """The code's ``SimpleLinear`` rows (``head_init="kaiming"``): weights Kaiming-uniform with gain 1,
        bias zero; ``"linear"``: ``nn.Linear``'s default (weights 1/sqrt(3) as wide, a uniform bias)."""
        rows = nn.Linear(width, count)
        if self.config.head_init == "kaiming":
            nn.init.kaiming_uniform_(rows.weight, nonlinearity="linear")
            nn.init.zeros_(rows.bias)
        return rows

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        """The head, every magnitude, and the current direction's A and B."""
        yield from super().trainable_parameters()
        yield from self.magnitudes
        training = self.training_component()
        if training is not None:
            for layer in self.layers:
                yield from layer.components[training].parameters()
