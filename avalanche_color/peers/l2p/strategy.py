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

from avalanche_color.peers.l2p.config import L2PConfig, L2PModelOptions
from avalanche_color.peers.l2p.model import L2PViT
from avalanche_color.training.strategy import ConfiguredStrategy, incompatible_plugin_reasons

# The Avalanche plugins L2P refuses, and why (every other plugin is passed through).
L2P_TABLE = incompatible_plugin_reasons(
    replay="L2P is rehearsal-free and, in training, masks the logits of the classes outside the current "
           "experience, so replayed samples of earlier classes would get an infinite loss",
    distillation="L2P keeps its backbone frozen and grows its head with each experience's classes, so the "
                 "previous model's outputs do not line up with the current ones",
    regularisation="L2P's head grows with each experience's classes, so per-parameter importances of earlier "
                   "experiences do not line up with its parameters",
    schedule="L2P builds a fresh Adam over its pool and head in every experience, with the L2P paper's constant "
             "learning rate; a scheduler bound to another optimiser would be silently ignored. To change the "
             "schedule, subclass L2P and override make_optimizer",
    fresh_model="resetting the model would discard the prompt pool and head learned so far",
)


class L2P(ConfiguredStrategy):
    """Learning to Prompt (Wang et al., CVPR 2022) with a frozen timm ViT of any size.

    A pool of ``pool_size`` prompts with keys is shared by all experiences;
    each sample uses the ``top_n`` prompts whose keys best match its frozen
    [CLS] feature; a surrogate loss pulls the chosen keys towards the queries;
    in class-incremental streams the logits of classes outside the current
    experience are masked in training. Adam over pool and head, restarted per
    experience.

    Defaults from the L2P paper: M=10 prompts of L_p=5 tokens, N=5 chosen, Adam (betas 0.9,
    0.999) with constant lr 0.03, batch 128, 5 epochs (Split CIFAR-100); the surrogate weight
    0.1 is Avalanche's port's ``sim_coefficient``. With the defaults it trains as Avalanche's
    ``LearningToPrompt`` does (given the same ViT, pool and head, and no position embedding for the
    prompts, a test gets the same logits; at evaluation ours gives classes never trained ``-inf``);
    three options restore what L2P's authors' code (google-research/l2p) does besides:
    ``grad_clip_norm=1.0``, ``batchwise_selection="always"``, ``lr_batch_scaling=True``. The
    options are the fields of :class:`~avalanche_color.peers.l2p.config.L2PConfig`, declared and checked there.
    """

    model: L2PViT
    config: L2PConfig
    # In training: the batch's queries and (batch, top_n) selected prompts, for the surrogate loss.
    mb_query: Optional[Tensor] = None
    mb_selection: Optional[Tensor] = None
    config_class: ClassVar[type[L2PConfig]] = L2PConfig
    model_class: ClassVar[type[L2PViT]] = L2PViT
    model_config_class: ClassVar[type[L2PModelOptions]] = L2PModelOptions
    incompatible_plugins = L2P_TABLE
    optimizer_description = "Adam over the prompt pool and the head, constant learning rate"
    optimizer_options = ("lr",)
    # The forward selects the prompts before the model predicts with them, outside a DDP wrapper.
    trains_distributed = False

    def make_optimizer(self, **kwargs: Any) -> None:
        """A fresh Adam over the pool and the head (state reset per experience, as L2P's code), at
        ``config.adam_lr`` (``lr``, scaled by ``train_mb_size / 256`` with ``lr_batch_scaling``)."""
        self.optimizer = torch.optim.Adam(list(self.model.trainable_parameters()), lr=self.config.adam_lr,
                                          betas=(0.9, 0.999))

    def optimizer_step(self) -> None:
        """Adam's step; with ``grad_clip_norm``, first the gradients of the parameters it updates are
        scaled by ``min(1, grad_clip_norm / (norm + 1e-6))``, their global L2 norm (L2P's code's rule)."""
        if self.config.grad_clip_norm is not None:
            self.precision.unscale(self.optimizer)  # under precision="16-mixed", the true gradients are clipped
            trained = [p for group in self.optimizer.param_groups for p in group["params"]]
            nn.utils.clip_grad_norm_(trained, self.config.grad_clip_norm)
        super().optimizer_step()

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
