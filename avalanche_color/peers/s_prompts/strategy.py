"""S-Prompts as an Avalanche strategy: CoLoR's training and routing with prompt-token experts."""

from __future__ import annotations

from typing import ClassVar

from avalanche_color.peers.s_prompts.config import SPromptsConfig
from avalanche_color.training.template import RoutedExpertsTemplate
from avalanche_color.peers.s_prompts.model import PromptExpertViT


class SPrompts(RoutedExpertsTemplate):
    """S-Prompts (Wang et al., NeurIPS 2022), image-prompt variant (S-iPrompts), on any timm ViT.

    Each training experience gets its own expert: ``prompt_length`` learnable
    tokens inserted behind the [CLS] token of a frozen ViT, plus a linear head
    on the [CLS] feature. Everything else is CoLoR's, from the same code: SGD
    with a cosine schedule restarting per experience, k-means prototypes of the
    frozen backbone's features after each experience, nearest-prototype routing
    per sample at evaluation (S-Prompts' own code used L1 distance; pass
    ``distance="l1"`` for that).

    Options are the fields of :class:`~avalanche_color.config.SPromptsConfig`:
    defaults prompt length 10, lr 0.01, SGD momentum 0.9, weight decay 2e-4,
    batch 128 (S-Prompts' published configs); k 5 (S-Prompts' and the CoLoR
    paper's choice for domain-incremental streams); 50 epochs like CoLoR.

    Args:
        model: a timm ``VisionTransformer`` (frozen, not changed), or a
            :class:`PromptExpertViT` to continue from (then ``prompt_length``,
            ``routing`` and ``distance`` must stay unset).
        config: a :class:`~avalanche_color.config.SPromptsConfig`; keyword options replace its fields.
        criterion, device, plugins, evaluator, and Avalanche's other keywords: as :class:`~avalanche_color.CoLoR`.
    """

    model: PromptExpertViT
    config: SPromptsConfig
    config_class: ClassVar[type[SPromptsConfig]] = SPromptsConfig
    model_class: ClassVar[type[PromptExpertViT]] = PromptExpertViT
