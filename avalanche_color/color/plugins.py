"""Give any Avalanche strategy CoLoR's LoRA experts (pair it with the prototype router plugin)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
from avalanche.core import SupervisedPlugin

from avalanche_color.color.model import ExpertViT
from avalanche_color.color.config import LoRAOptions

if TYPE_CHECKING:
    from avalanche.training.templates import SupervisedTemplate


class LoRAExpertsPlugin(SupervisedPlugin):
    """Give any Avalanche strategy CoLoR's experts.

    Before training, the strategy's timm ViT becomes an :class:`ExpertViT`:
    frozen, with a rank-r LoRA expert on q and v of every block and a linear
    head for each training experience (added by Avalanche's model adaptation).
    Pair it with :class:`~avalanche_color.PrototypeRouterPlugin` to route at evaluation.
    Avalanche's strategies call ``model(x)``, which returns only logits; after each
    evaluation forward the plugin routes the batch again (the same experts, one more
    routing pass) and keeps the experts in ``strategy.mb_experts`` for the
    routing-accuracy metric.

    Args: as :class:`ExpertViT` (a :class:`~avalanche_color.config.LoRAOptions`
    and/or its options as keywords: ``rank``, ``alpha``, ``routing``, ``distance``, ...).
    """

    def __init__(self, config: Optional[LoRAOptions] = None, /, **options: Any) -> None:
        super().__init__()
        self.config = LoRAOptions.build(config, **options)  # fail at construction, not mid-run

    def before_training(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        if not isinstance(strategy.model, ExpertViT):
            strategy.model = ExpertViT(strategy.model, self.config).to(strategy.device)

    @torch.no_grad()
    def after_eval_forward(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        model = strategy.model
        routed = isinstance(model, ExpertViT) and model.num_experts and not model.training
        strategy.mb_experts = model.route(strategy.mb_x, strategy.mb_task_id) if routed else None
