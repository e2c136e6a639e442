"""S-Prompts as an Avalanche strategy: CoLoR's training and routing with prompt-token experts."""

from __future__ import annotations

from typing import ClassVar

from avalanche_color.peers.s_prompts.config import PromptOptions, SPromptsConfig
from avalanche_color.peers.s_prompts.model import PromptExpertViT
from avalanche_color.training.strategy import RoutedExpertsTemplate


class SPrompts(RoutedExpertsTemplate):
    """S-Prompts (Wang et al., NeurIPS 2022), image-prompt variant (S-iPrompts), on any timm ViT.

    Each training experience gets its own expert: ``prompt_length`` learnable
    tokens inserted behind the [CLS] token of a frozen ViT, plus a linear head
    on the [CLS] feature. Everything else is CoLoR's, from the same code: SGD
    with a cosine schedule restarting per experience, k-means prototypes of the
    frozen backbone's features after each experience, nearest-prototype routing
    per sample at evaluation, by L1 distance as S-Prompts' own code
    (``distance="euclidean"``: CoLoR's).

    ``lr_schedule="epoch_cosine"``: the cosine per epoch of S-Prompts' code instead.

    Defaults: prompt length 10, lr 0.01, SGD momentum 0.9, weight decay 2e-4, batch 128
    (S-Prompts' published configs); k 5 (S-Prompts' and the CoLoR paper's choice for
    domain-incremental streams); 50 epochs like CoLoR. The options are the fields of
    :class:`~avalanche_color.peers.s_prompts.config.SPromptsConfig`, declared and checked there.
    """

    model: PromptExpertViT
    config: SPromptsConfig
    config_class: ClassVar[type[SPromptsConfig]] = SPromptsConfig
    model_class: ClassVar[type[PromptExpertViT]] = PromptExpertViT
    model_config_class: ClassVar[type[PromptOptions]] = PromptOptions

    def restart_schedule(self) -> None:
        """As ``lr_schedule``: the template's cosine per step, or S-Prompts' code's cosine per epoch."""
        if self.config.lr_schedule == "epoch_cosine":
            return self.restart_cosine_per_epoch()
        super().restart_schedule()
