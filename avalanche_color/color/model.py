"""CoLoR's model: a frozen timm ViT with one LoRA expert and one head per experience.

The heads, routing and state handling are shared with the other routed expert
models (:mod:`avalanche_color.experts.routed_vit`); this module says what a LoRA
expert is: :class:`~avalanche_color.lora.qv_experts.QKVExperts` in place of every
block's ``attn.qkv``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Optional

from torch import Tensor, nn

from avalanche_color.config import LoRAOptions
from avalanche_color.experts.backbone import backbone_images, check_vision_transformer
from avalanche_color.experts.routed_vit import RoutedExpertViT
from avalanche_color.lora.qv_experts import QKVExperts
from avalanche_color.lora.segments import ExpertSelection


class ExpertViT(RoutedExpertViT):
    """CoLoR's model: a frozen ViT, LoRA experts on q and v of every block, their heads.

    Experts, heads, routing and outputs are those of :class:`RoutedExpertViT`; an
    expert here is one :class:`~avalanche_color.lora.qv_experts.QVLoRA` per block.

    Args:
        vit: a timm ``VisionTransformer`` without LoRA experts; it is adapted in place and
            frozen (the strategies give it a copy of the ViT they are given).
        config: :class:`~avalanche_color.config.LoRAOptions` (or a
            :class:`~avalanche_color.config.CoLoRConfig`); keyword options
            (``rank``, ``alpha``, ``routing``, ``distance``, ...) replace its fields.
    """

    config: LoRAOptions

    def __init__(self, vit: nn.Module, config: Optional[LoRAOptions] = None, /, **options: Any) -> None:
        check_vit(vit)
        config = LoRAOptions.build(config, **options)
        super().__init__(vit, config)
        self.qkv_layers: list[QKVExperts] = []
        for block in vit.blocks:
            layer = QKVExperts(block.attn.qkv)
            block.attn.qkv = layer
            self.qkv_layers.append(layer)

    @property
    def rank(self) -> int:
        return self.config.rank

    @property
    def alpha(self) -> float:
        return self.config.scaling_alpha

    # ------------------------------------------------------------------ LoRA experts

    def _add_expert_modules(self) -> None:
        for layer in self.qkv_layers:
            layer.add_expert(self.rank, self.alpha)

    def expert_modules(self, expert: int) -> Iterator[nn.Module]:
        """The expert's LoRA modules, one per block."""
        for layer in self.qkv_layers:
            yield layer.experts[expert]

    @contextmanager
    def selected(self, experts: ExpertSelection) -> Iterator[None]:
        """Run the backbone with ``experts``: None, one index, or runs of a sorted batch."""
        for layer in self.qkv_layers:
            layer.select(experts)
        try:
            yield
        finally:
            for layer in self.qkv_layers:
                layer.select(None)

    def features(self, x: Tensor, experts: ExpertSelection = None) -> Tensor:
        """The pooled ([CLS]) features after the final norm, shape (batch, num_features).

        With a mixed batch each layer runs one matmul per expert on its run of samples.
        """
        x = backbone_images(self.backbone, x)
        with self.selected(experts):
            tokens = self.backbone.forward_features(x)
        return self.backbone.forward_head(tokens, pre_logits=True)

    # ------------------------------------------------------------------ state

    def _is_backbone_weight(self, key: str) -> bool:
        return key.startswith("backbone.") and ".experts." not in key

    def _check_stored_experts(self, state_dict: dict[str, Any], prefix: str) -> None:
        a_key = prefix + "backbone.blocks.0.attn.qkv.experts.0.A"
        if a_key in state_dict and state_dict[a_key].shape[1] != self.rank:
            raise ValueError(
                f"state has LoRA rank {state_dict[a_key].shape[1]}, this model has rank {self.rank}"
            )


def check_vit(model: nn.Module) -> None:
    """Refuse anything but a timm VisionTransformer with fused ``nn.Linear`` qkv projections
    (``TypeError``), and a ViT whose qkv already carry LoRA experts (``ValueError``)."""
    check_vision_transformer(model)
    for index, block in enumerate(model.blocks):
        qkv = getattr(getattr(block, "attn", None), "qkv", None)
        if not isinstance(qkv, (nn.Linear, QKVExperts)):
            raise TypeError(
                f"model.blocks[{index}].attn must have a fused nn.Linear 'qkv' projection, "
                f"got {type(qkv).__name__}"
            )
        if isinstance(qkv, QKVExperts):
            raise ValueError("model already carries LoRA experts (an ExpertViT adapted it in place): pass a "
                             "plain timm ViT to start anew, or that ExpertViT (strategy.model) to continue from it")
