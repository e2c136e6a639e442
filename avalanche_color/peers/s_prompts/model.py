"""S-Prompts' model: a frozen timm ViT with one set of prompt tokens and one head per experience.

The expert bank, routing and state handling are CoLoR's (:mod:`avalanche_color.experts.routed_vit`);
only the expert differs: ``prompt_length`` learnable tokens inserted into the
token sequence (:mod:`avalanche_color.peers.prompts`) instead of LoRA matrices.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor, nn

from avalanche_color.peers.s_prompts.config import PromptOptions
from avalanche_color.experts.routed_vit import RoutedExpertViT, backbone_images
from avalanche_color.peers.prompts import new_prompts, prompt_width, prompted_features, s_prompts_bound
from avalanche_color.lora import ExpertSelection, Segments


class PromptTokens(nn.Module):
    """One expert's prompt tokens, (prompt_length, width), initialised as in S-Prompts."""

    def __init__(self, prompt_length: int, width: int) -> None:
        super().__init__()
        self.tokens = new_prompts(prompt_length, width, s_prompts_bound(width))


class PromptExpertViT(RoutedExpertViT):
    """S-Prompts (S-iPrompts): a frozen ViT, prompt-token experts, their heads, prototype routing.

    Each expert is ``prompt_length`` tokens inserted behind the [CLS] token
    (without positional embedding) and a linear head on the pooled [CLS]
    feature. Training and routing are as in :class:`~avalanche_color.ExpertViT`.
    A mixed batch takes one forward: every sample carries its own expert's tokens.

    Args:
        vit: a timm ``VisionTransformer``; it is frozen, not changed.
        config: :class:`~avalanche_color.config.PromptOptions` (or a
            :class:`~avalanche_color.config.SPromptsConfig`); keyword options
            (``prompt_length``, at least 1, ``routing_features``, ``router``, ``distance``, ...) replace its fields.
    """

    config: PromptOptions
    options_class = PromptOptions
    expert_shape_options = ("prompt_length",)

    def __init__(self, vit: nn.Module, config: Optional[PromptOptions] = None, /, **options: Any) -> None:
        config = PromptOptions.build(config, **options)
        kind = PromptExpertKind(vit, config.prompt_length)
        super().__init__(vit, config, kind)
        self.prompts = kind.prompts  # the experts' slot

    @property
    def prompt_length(self) -> int:
        return self.config.prompt_length

    def features(self, x: Tensor, experts: ExpertSelection = None, trained: Optional[int] = None) -> Tensor:
        """The pooled ([CLS]) features after the final norm with the experts' prompts (every expert's
        prompts are computed alike, trained or not)."""
        x = backbone_images(self.backbone, x)
        if experts is None:
            return self.backbone.forward_head(self.backbone.forward_features(x), pre_logits=True)
        return prompted_features(self.backbone, x, self.prompts_of(experts, x.shape[0]))

    def prompts_of(self, experts: ExpertSelection, batch_size: int) -> Tensor:
        """(prompt_length, width) tokens of one expert, or (batch, prompt_length, width) per sample."""
        if isinstance(experts, int):
            return self.prompts[experts].tokens
        return torch.cat([
            self.prompts[expert].tokens.expand(run.stop - run.start, -1, -1)
            for expert, run in _bounded(experts, batch_size)
        ])


def _bounded(segments: Segments, batch_size: int) -> Segments:
    """Segments with explicit bounds (a run may be ``slice(None)`` for the whole batch)."""
    return [(expert, slice(*run.indices(batch_size)[:2])) for expert, run in segments]


class PromptExpertKind:
    """S-Prompts' expert kind: ``length`` prompt tokens as wide as the ViT's, in one slot."""

    def __init__(self, vit: nn.Module, length: int) -> None:
        self.vit = vit
        self.length = length
        self.prompts = nn.ModuleList()
        self.slots = [self.prompts]

    def new_expert_modules(self) -> list[nn.Module]:
        device = self.vit.patch_embed.proj.weight.device  # where the model is now
        return [PromptTokens(self.length, prompt_width(self.vit)).to(device)]
