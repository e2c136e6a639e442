"""Give any Avalanche strategy CoLoR's LoRA experts (pair it with the prototype router plugin)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from avalanche_color.color.model import ExpertViT
from avalanche_color.color.config import LoRAOptions
from avalanche_color.training.data_checks import DataChecksPlugin
from avalanche_color.utils.checks import boolean, require

if TYPE_CHECKING:
    from avalanche.training.templates import SupervisedTemplate


class LoRAExpertsPlugin(DataChecksPlugin):
    """Give any Avalanche strategy CoLoR's experts.

    Before training, the strategy's timm ViT becomes an :class:`ExpertViT`:
    frozen, with a rank-r LoRA expert on q and v of every block and a linear
    head for each training experience (added by Avalanche's model adaptation).
    Pair it with :class:`~avalanche_color.PrototypeRouterPlugin` to route at evaluation.
    Avalanche's strategies call ``model(x)`` (with task labels where the stream has them):
    one routing pass and one expert pass per batch, as in :class:`~avalanche_color.CoLoR`; the
    experts chosen are in ``strategy.model.routed_experts``, where the routing-accuracy metric
    reads them.

    It is also the package's :class:`~avalanche_color.DataChecksPlugin` (every strategy of the
    package runs the same checks): bad data is refused before the experience's expert exists,
    non-finite evaluation pixels before the forward pass, and a non-finite loss stops training.

    Args: as :class:`ExpertViT` (a :class:`~avalanche_color.config.LoRAOptions` and/or its
    options as keywords: ``rank``, ``alpha``, ``routing_features``, ``router``, ``distance``, ...),
    and ``check_data``: scan each training experience's samples before training on it (with
    False, empty experiences, evaluation pixels and the loss are still checked).
    """

    def __init__(self, config: Optional[LoRAOptions] = None, /, *, check_data: bool = True, **options: Any) -> None:
        require("check_data", check_data, boolean)
        super().__init__(scan_experiences=check_data)
        self.config = LoRAOptions.build(config, **options)  # fail at construction, not mid-run

    def before_training(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        if not isinstance(strategy.model, ExpertViT):
            strategy.model = ExpertViT(strategy.model, self.config).to(strategy.device)
