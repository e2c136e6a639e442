"""Learning to Prompt (L2P, Wang et al., CVPR 2022) on any timm ViT, as an Avalanche strategy.

The project's own implementation of the paper, not Avalanche's ``LearningToPrompt``:
that one builds its ViT from a fixed list of 224 px model names, hard-codes
768-wide heads, keeps a second full ViT for the queries and fails with timm 1.x.
Here the user's ViT is used as it is (width, depth, image size and prefix
tokens read from the model), and the query is the same frozen ViT run
without prompts.
"""

from __future__ import annotations

from typing import Any, ClassVar, Optional

import torch
from torch import Tensor, nn

from avalanche_color.peers.l2p.config import L2PConfig
from avalanche_color.peers.l2p.model import L2PViT
from avalanche_color.training.configured_strategy import ConfiguredStrategy
from avalanche_color.utils.experiences import continues_experience
from avalanche_color.training.plugin_compatibility import L2P_TABLE


class L2P(ConfiguredStrategy):
    """Learning to Prompt (Wang et al., CVPR 2022) with a frozen timm ViT of any size.

    A pool of ``pool_size`` prompts with keys is shared by all experiences;
    each sample uses the ``top_n`` prompts whose keys best match its frozen
    [CLS] feature; a surrogate loss pulls the chosen keys towards the queries;
    in class-incremental streams the logits of classes outside the current
    experience are masked in training. Adam over pool and head, restarted per
    experience.

    Options are the fields of :class:`~avalanche_color.config.L2PConfig`, with the L2P
    paper's defaults: M=10 prompts of L_p=5 tokens, N=5 chosen, Adam (betas 0.9,
    0.999) with constant lr 0.03, batch 128, 5 epochs (Split CIFAR-100); the
    surrogate weight 0.1 is the L2P code's ``pull_constraint_coeff``.

    Args:
        model: a timm ``VisionTransformer`` (frozen, not changed), or an
            :class:`L2PViT` to continue from (then the pool and head options
            must stay unset).
        config: an :class:`~avalanche_color.config.L2PConfig`; keyword options replace its fields.
        criterion: the classification loss; a new ``CrossEntropyLoss`` by default.
        device, plugins, evaluator, and Avalanche's other keywords: as :class:`~avalanche_color.CoLoR`.
    """

    model: L2PViT
    config: L2PConfig
    # In training: the batch's queries and (batch, top_n) selected prompts, for the surrogate loss.
    mb_query: Optional[Tensor] = None
    mb_selection: Optional[Tensor] = None
    config_class: ClassVar[type[L2PConfig]] = L2PConfig
    model_class: ClassVar[type[L2PViT]] = L2PViT
    incompatible_plugins = L2P_TABLE
    optimizer_description = "Adam over the prompt pool and the head, constant learning rate"
    optimizer_options = ("lr",)

    def first_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        # Replaced by make_optimizer before each experience, once the head covers its classes.
        return torch.optim.Adam(model.pool.parameters(), lr=self.config.lr)

    def check_model_and_optimizer(self, **kwargs: Any) -> None:
        # The head grows in the model adaptation, so the optimiser comes after it; the
        # chunks of an online stream's experience (with task boundaries) continue its optimiser.
        self.model = self.model_adaptation()
        if not continues_experience(self.experience):
            self.make_optimizer(**kwargs)

    def make_optimizer(self, **kwargs: Any) -> None:
        """A fresh Adam over the pool and the head (state reset per experience, as L2P's code)."""
        self.optimizer = torch.optim.Adam(list(self.model.trainable_parameters()), lr=self.config.lr,
                                          betas=(0.9, 0.999))

    def forward(self) -> Tensor:
        """Training: select each sample's prompts (kept for the surrogate loss), then predict with them."""
        if not self.is_training:
            return self.model(self.mb_x)
        self.mb_query, self.mb_selection = self.model.select_prompts(self.mb_x)
        return self.model(self.mb_x, self.mb_selection)

    def criterion(self) -> Tensor:
        """Classification loss, plus in training the surrogate loss pulling the chosen keys to the queries."""
        loss = self._criterion(self.mb_output, self.mb_y)
        weight = self.config.surrogate_weight
        if self.is_training and weight:
            loss = loss + weight * self.model.pool.surrogate_loss(self.mb_query, self.mb_selection)
        return loss
