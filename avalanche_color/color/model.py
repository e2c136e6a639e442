"""CoLoR's model: a frozen timm ViT with one LoRA expert and one head per experience, and the plugin that
gives any Avalanche strategy that model.

The expert bank, the router and the state handling are shared with the other routed
expert models (:mod:`avalanche_color.experts.routed_vit`); this module says what a LoRA
expert is: one :class:`~avalanche_color.lora.QVLoRA` in the
:class:`~avalanche_color.lora.QKVExperts` that replaces every block's ``attn.qkv``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional

from timm.models.vision_transformer import Attention, Block
from torch import Tensor, nn

from avalanche_color.color.config import LoRAOptions
from avalanche_color.experts.routed_vit import RoutedExpertViT, backbone_images, check_vision_transformer
from avalanche_color.lora import ExpertSelection, QKVExperts, QVExpertKind, expert_tokens
from avalanche_color.routing.rematching import RematchingRule
from avalanche_color.training.data_checks import DataChecksPlugin
from avalanche_color.training.strategy import routed_forward
from avalanche_color.utils.checks import boolean, require

if TYPE_CHECKING:
    from avalanche.training.templates import SupervisedTemplate


class ExpertViT(RoutedExpertViT):
    """CoLoR's model: a frozen ViT, LoRA experts on q and v of every block, their heads.

    Experts, heads, routing and outputs are those of :class:`RoutedExpertViT`; an
    expert here is one :class:`~avalanche_color.lora.QVLoRA` per block (the
    slots are the blocks' ``attn.qkv.experts`` lists; :class:`~avalanche_color.lora.QVExpertKind`
    makes them).

    Args:
        vit: a timm ``VisionTransformer`` without LoRA experts; it is adapted in place and
            frozen (the strategies give it a copy of the ViT they are given). It may be cast to
            bfloat16: the experts and heads are float32 all the same (:func:`~avalanche_color.lora.trained_dtype`),
            the logits float32, with or without autocast.
        config: :class:`~avalanche_color.config.LoRAOptions` (or a
            :class:`~avalanche_color.config.CoLoRConfig`); keyword options
            (``rank``, ``alpha``, ``routing_features``, ``router``, ``distance``, ...) replace its fields.
    """

    config: LoRAOptions
    options_class = LoRAOptions
    expert_shape_options = ("rank",)
    mixed_kernel = "auto"  # the qkv layers take one expert per sample: gathered on CUDA, runs on a CPU

    def __init__(self, vit: nn.Module, config: Optional[LoRAOptions] = None, /, **options: Any) -> None:
        check_vit(vit)
        config = LoRAOptions.build(config, **options)
        layers = [QKVExperts(block.attn.qkv) for block in vit.blocks]
        for block, layer in zip(vit.blocks, layers):
            block.attn.qkv = layer
        # The backbone's own state is recorded with its layers in place; rank and alpha go down to the
        # layers once, with the kind of expert the model makes.
        super().__init__(vit, config, QVExpertKind(layers, config.rank, config.scaling_alpha))
        self.qkv_layers: list[QKVExperts] = layers

    @property
    def rank(self) -> int:
        return self.config.rank

    @property
    def alpha(self) -> float:
        return self.config.scaling_alpha

    @property
    def top_m(self) -> int:
        """The ``top_m`` option: how many experts the router proposes per sample at evaluation."""
        return self.config.top_m

    @property
    def top_m_rule(self) -> str:
        """The ``top_m_rule`` option: how one of the ``top_m`` candidates is picked."""
        return self.config.top_m_rule

    @property
    def rematching(self) -> Optional[RematchingRule]:
        """The ``rematching`` options as a rule (None with ``rematching="off"``, the paper's routing)."""
        config = self.config
        if config.rematching == "off":
            return None
        return RematchingRule(config.rematching, config.rematching_score, config.rematching_tau,
                              config.rematching_candidate)

    def start_expert(self, classes: Sequence[int], experience: int = -1, task: int = 0) -> int:
        """Add an expert for ``classes`` (see :meth:`RoutedExpertViT.start_expert`); with ``warm_start=True``
        it starts as the previous expert: its LoRA weights, and its head where the classes are the same."""
        index = super().start_expert(classes, experience, task)
        if self.config.warm_start and index > 0:
            self.bank.copy_expert(index - 1, index)
        return index

    # ------------------------------------------------------------------ LoRA experts (one QVLoRA per block)

    def features(self, x: Tensor, experts: ExpertSelection = None, trained: Optional[int] = None) -> Tensor:
        """The pooled ([CLS]) features after the final norm, shape (batch, num_features).

        ``experts`` and ``trained`` reach every block's qkv layer as arguments
        (:func:`~avalanche_color.lora.expert_tokens`); with a mixed batch each layer runs one matmul per
        expert on its run of samples.
        """
        x = backbone_images(self.backbone, x)
        return self.backbone.forward_head(expert_tokens(self.backbone, x, experts, trained), pre_logits=True)


def check_vit(model: nn.Module) -> None:
    """Refuse anything but a timm VisionTransformer with fused ``nn.Linear`` qkv projections
    (``TypeError``), and a ViT whose qkv already carry LoRA experts (``ValueError``)."""
    check_vision_transformer(model)
    for index, block in enumerate(model.blocks):
        # The experts reach the qkv layers through timm's Block and Attention forward, as
        # computed by avalanche_color.lora.expert_tokens; other block types compute otherwise.
        if type(block) is not Block or type(getattr(block, "attn", None)) is not Attention:
            raise TypeError(
                f"model.blocks[{index}] must be a timm Block with a timm Attention (as in the standard "
                f"VisionTransformer models), got {type(block).__name__} with {type(getattr(block, 'attn', None)).__name__}"
            )
        qkv = getattr(getattr(block, "attn", None), "qkv", None)
        if not isinstance(qkv, (nn.Linear, QKVExperts)):
            raise TypeError(
                f"model.blocks[{index}].attn must have a fused nn.Linear 'qkv' projection, "
                f"got {type(qkv).__name__}"
            )
        if isinstance(qkv, QKVExperts):
            raise ValueError("model already carries LoRA experts (an ExpertViT adapted it in place): pass a "
                             "plain timm ViT to start anew, or that ExpertViT (strategy.model) to continue from it")


class LoRAExpertsPlugin(DataChecksPlugin):
    """Give any Avalanche strategy CoLoR's experts.

    Before training, the strategy's timm ViT becomes an :class:`ExpertViT`:
    frozen, with a rank-r LoRA expert on q and v of every block and a linear
    head for each training experience (added by Avalanche's model adaptation).
    Pair it with :class:`~avalanche_color.PrototypeRouterPlugin` to route at evaluation.
    During evaluation the strategy's forward is CoLoR's (:func:`~avalanche_color.training.strategy.routed_forward`:
    ``model(x, return_experts=True)``, with task labels where the stream has them): one routing pass and one
    expert pass per batch, the logits Avalanche's ``mb_output``, the experts chosen the strategy's
    ``mb_routed_experts``, where the routing-accuracy metric reads them; the strategy's own forward is back
    after each evaluation.

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

    def before_eval(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        # An Avalanche strategy's forward returns the logits alone: for the evaluation, the routed one, which
        # keeps the experts beside them (an instance attribute over the class's method, removed after).
        if isinstance(strategy.model, RoutedExpertViT):
            strategy.forward = lambda: routed_forward(strategy, strategy.model)

    def after_eval(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        vars(strategy).pop("forward", None)
        strategy.mb_routed_experts = None
