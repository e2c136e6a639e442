"""S-Prompts' model: a frozen timm ViT with one set of prompt tokens and one head per experience.

Routing, heads and state handling are CoLoR's (:mod:`avalanche_color.experts`);
only the expert differs: ``prompt_length`` learnable tokens inserted into the
token sequence (:mod:`avalanche_color.prompts`) instead of LoRA matrices.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn

from avalanche_color.experts import RoutedExpertViT, Routing, check_images
from avalanche_color.lora import ExpertSelection
from avalanche_color.prompts import new_prompts, prompt_width, prompted_features, s_prompts_bound
from avalanche_color.prototypes import Distance


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
        prompt_length: tokens per expert (S-Prompts: 10). 0 leaves only the head
            (a linear probe per experience).
        routing, distance, normalize_features: as :class:`~avalanche_color.ExpertViT`.
    """

    def __init__(
        self,
        vit: nn.Module,
        *,
        prompt_length: int = 10,
        routing: Routing = "backbone",
        distance: Distance = "euclidean",
        normalize_features: bool = True,
    ) -> None:
        check_prompt_length(prompt_length)
        super().__init__(vit, routing=routing, distance=distance, normalize_features=normalize_features)
        self.prompt_length = prompt_length
        self.prompts = nn.ModuleList()

    def _add_expert_modules(self) -> None:
        self.prompts.append(PromptTokens(self.prompt_length, prompt_width(self.backbone)).to(self.device))

    def expert_modules(self, expert: int) -> Iterator[nn.Module]:
        """The expert's prompt tokens."""
        yield self.prompts[expert]

    def features(self, x: Tensor, experts: ExpertSelection = None) -> Tensor:
        """The pooled ([CLS]) features after the final norm with the experts' prompts."""
        check_images(self.backbone, x)
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

    def _check_stored_experts(self, state_dict: dict, prefix: str) -> None:
        key = prefix + "prompts.0.tokens"
        if key in state_dict and state_dict[key].shape[0] != self.prompt_length:
            raise ValueError(
                f"state has prompt length {state_dict[key].shape[0]}, this model has {self.prompt_length}"
            )


def _bounded(segments: list[tuple[int, slice]], batch_size: int) -> list[tuple[int, slice]]:
    """Segments with explicit bounds (a run may be ``slice(None)`` for the whole batch)."""
    return [(expert, slice(*run.indices(batch_size)[:2])) for expert, run in segments]


def check_prompt_length(prompt_length: object) -> None:
    if isinstance(prompt_length, bool) or not isinstance(prompt_length, int) or prompt_length < 0:
        raise ValueError(f"prompt_length must be an integer >= 0, got {prompt_length!r}")
