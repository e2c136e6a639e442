"""SD-LoRA as an Avalanche strategy (Wu et al., "SD-LoRA: Scalable Decoupled Low-Rank Adaptation for
Class Incremental Learning", ICLR 2025; code WuYichen-97/SD-Lora-CL).

The model and each choice with its source: :mod:`avalanche_color.peers.sd_lora.model`.
Training, from ``models/sdlora.py``: one classifier over every class seen (``IncrementalNet``'s
``fc`` grows, old rows kept); the loss of a later task is the cross-entropy over the logits of
its own classes only (``logits[:, known_classes:]``), so old-class logits are left out of
training and used at evaluation; what trains is the new direction, every magnitude and the
classifier; one forward per sample at inference, nothing routed.
"""

from __future__ import annotations

from typing import ClassVar

from avalanche_color.peers.lora_sum.strategy import LoRASumTemplate
from avalanche_color.peers.sd_lora.config import SDLoRAConfig
from avalanche_color.peers.sd_lora.model import SDLoRAViT


class SDLoRA(LoRASumTemplate):
    """SD-LoRA on any timm ViT: frozen LoRA directions, magnitudes that keep learning, one classifier.

    In experience t, and at the evaluation after it,
    ``W = W0 + sum_{i<t} alpha_i B_i A_i / (||B_i||_F ||A_i||_F) + alpha_t B_t A_t`` on the query and
    value projections of every block, as the authors' code computes. Each training experience adds
    a direction (rank ``rank``) learned with its magnitude; once the experience ends the direction
    is frozen (bit-identical from then on), and it is normalised when the next experience starts,
    when every magnitude restarts at ``magnitude_init`` and learns again. Defaults: the official
    code's Split CIFAR-100 run; the paper's reading is ``direction_norm="product",
    normalise_when="finish", earlier_magnitudes="keep"``.
    """

    model: SDLoRAViT
    config: SDLoRAConfig
    config_class: ClassVar[type[SDLoRAConfig]] = SDLoRAConfig
    model_class: ClassVar[type[SDLoRAViT]] = SDLoRAViT
    model_config_class: ClassVar[type[SDLoRAConfig]] = SDLoRAConfig
