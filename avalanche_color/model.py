"""CoLoR's model: a frozen timm ViT with one LoRA expert and one head per experience.

The heads, routing and state handling are shared with the other routed expert
models (:mod:`avalanche_color.experts`); this module says what a LoRA expert is.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Optional

from torch import Tensor, nn

from avalanche_color.experts import (ROUTINGS, ExpertHead, RoutedExpertViT, Routing, check_images,
                                     check_vision_transformer)
from avalanche_color.lora import ExpertSelection, QKVExperts
from avalanche_color.prototypes import DISTANCES, Distance
from avalanche_color.validation import check_choice, check_positive, check_positive_int

# Re-exported: they lived here before the shared base existed.
__all__ = ["ExpertHead", "ExpertViT", "ROUTINGS", "Routing", "check_images", "check_vit"]


class ExpertViT(RoutedExpertViT):
    """CoLoR's model: a frozen ViT, LoRA experts on q and v of every block, their heads.

    In training mode the newest expert predicts (Avalanche adds one per new
    training experience through :meth:`adaptation`). In eval mode each sample is
    routed to the expert of its nearest prototype, or, with ``routing="oracle"``,
    to the expert trained on its task label. Outputs cover the global class
    space: classes the chosen expert does not know get ``-inf``.

    Args:
        vit: a timm ``VisionTransformer``; it is adapted in place and frozen.
        rank: LoRA rank r of every expert.
        alpha: LoRA alpha; updates are scaled by ``alpha / rank``. Defaults to ``rank``.
        routing: ``"backbone"`` routes with the frozen ViT's features (CoLoR),
            ``"first_expert"`` with the features of the ViT plus the first expert
            (CoLoR++), ``"oracle"`` with the task labels (task-incremental streams).
        distance: distance between features and prototypes.
        normalize_features: L2-normalise features before clustering and routing.
    """

    def __init__(
        self,
        vit: nn.Module,
        *,
        rank: int = 64,
        alpha: Optional[float] = None,
        routing: Routing = "backbone",
        distance: Distance = "euclidean",
        normalize_features: bool = True,
    ) -> None:
        check_vit(vit)
        self.check_options(rank=rank, alpha=alpha, routing=routing, distance=distance)
        super().__init__(vit, routing=routing, distance=distance, normalize_features=normalize_features)
        self.rank = rank
        self.alpha = float(rank if alpha is None else alpha)
        self.qkv_layers: list[QKVExperts] = []
        for block in vit.blocks:
            layer = QKVExperts(block.attn.qkv)
            block.attn.qkv = layer
            self.qkv_layers.append(layer)

    @staticmethod
    def check_options(*, rank: int, alpha: Optional[float], routing: str, distance: str) -> None:
        """Refuse options outside what the model supports."""
        check_positive_int("rank", rank)
        if alpha is not None:
            check_positive("alpha", alpha)
        check_choice("routing", routing, ROUTINGS)
        check_choice("distance", distance, DISTANCES)

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
        check_images(self.backbone, x)
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
    """Refuse anything but a timm VisionTransformer with fused qkv projections."""
    check_vision_transformer(model)
    for index, block in enumerate(model.blocks):
        qkv = getattr(getattr(block, "attn", None), "qkv", None)
        if not isinstance(qkv, (nn.Linear, QKVExperts)):
            raise TypeError(
                f"model.blocks[{index}].attn must have a fused nn.Linear 'qkv' projection, "
                f"got {type(qkv).__name__}"
            )
        if isinstance(qkv, QKVExperts):
            raise ValueError("model already carries LoRA experts: pass the plain timm ViT")
