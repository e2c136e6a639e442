"""Give any Avalanche strategy CoLoR's LoRA experts (pair it with the prototype router plugin)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

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
    Avalanche's strategies call ``model(x)`` (with task labels where the stream has them):
    one routing pass and one expert pass per batch, as in :class:`~avalanche_color.CoLoR`; the
    experts chosen are in ``strategy.model.routed_experts``, where the routing-accuracy metric
    reads them.

    Args: as :class:`ExpertViT` (a :class:`~avalanche_color.config.LoRAOptions` and/or its
    options as keywords: ``rank``, ``alpha``, ``routing_features``, ``router``, ``distance``, ...).
    """

    def __init__(self, config: Optional[LoRAOptions] = None, /, **options: Any) -> None:
        super().__init__()
        self.config = LoRAOptions.build(config, **options)  # fail at construction, not mid-run

    def before_training(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        if not isinstance(strategy.model, ExpertViT):
            strategy.model = ExpertViT(strategy.model, self.config).to(strategy.device)
