"""Learning to Prompt (L2P, Wang et al., CVPR 2022) on any timm ViT, as an Avalanche strategy.

The project's own implementation of the paper, not Avalanche's ``LearningToPrompt``:
that one builds its ViT from a fixed list of 224 px model names, hard-codes
768-wide heads, keeps a second full ViT for the queries and fails with timm 1.x.
Here the user's ViT is used as it is (width, depth, image size and prefix
tokens read from the model), and the query is the same frozen ViT run
without prompts.
"""

from collections.abc import Sequence
from typing import Any, ClassVar, Optional, Union

import torch
from avalanche.core import BasePlugin
from avalanche.training.plugins.evaluation import default_evaluator
from torch import Tensor, nn

from avalanche_color.config import Precision
from avalanche_color.peers.l2p.config import (BatchwiseSelection, HeadInit, HeadInput, L2PConfig, L2PModelOptions,
                                              PromptInit)
from avalanche_color.peers.l2p.model import L2PViT
from avalanche_color.training.strategy import Evaluator, StrategyBase, incompatible_plugin_reasons

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


class L2P(StrategyBase):
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

    def __init__(
        self,
        model: nn.Module,
        config: Optional[L2PConfig] = None,
        *,
        surrogate_weight: float = L2PConfig.surrogate_weight,
        lr: float = L2PConfig.lr,
        lr_batch_scaling: bool = L2PConfig.lr_batch_scaling,
        grad_clip_norm: Optional[float] = L2PConfig.grad_clip_norm,
        train_epochs: int = L2PConfig.train_epochs,
        # L2PModelOptions
        pool_size: int = L2PConfig.pool_size,
        prompt_length: int = L2PConfig.prompt_length,
        top_n: int = L2PConfig.top_n,
        head_input: HeadInput = L2PConfig.head_input,
        class_masking: bool = L2PConfig.class_masking,
        prompt_init: PromptInit = L2PConfig.prompt_init,
        head_init: HeadInit = L2PConfig.head_init,
        batchwise_selection: BatchwiseSelection = L2PConfig.batchwise_selection,
        # TrainingOptions
        train_mb_size: int = L2PConfig.train_mb_size,
        eval_mb_size: int = L2PConfig.eval_mb_size,
        eval_every: int = L2PConfig.eval_every,
        check_data: bool = L2PConfig.check_data,
        # PrecisionOptions
        precision: Precision = L2PConfig.precision,
        # LoaderOptions
        num_workers: int = L2PConfig.num_workers,
        pin_memory: Optional[bool] = L2PConfig.pin_memory,
        persistent_workers: bool = L2PConfig.persistent_workers,
        # Avalanche's (StrategyBase)
        criterion: Optional[nn.Module] = None,
        device: Union[str, torch.device] = "cpu",
        plugins: Optional[Sequence[BasePlugin]] = None,
        evaluator: Evaluator = default_evaluator,
        **template_options: Any,
    ) -> None:
        """L2P on ``model``, with the options of ``config`` and those given here (the others: their
        defaults).

        Each option (``surrogate_weight`` to ``persistent_workers``) is a field of
        :class:`~avalanche_color.peers.l2p.config.L2PConfig`, documented there; its default is the config's.
        ``criterion``, ``device``, ``plugins``, ``evaluator`` and Avalanche's other keywords: as
        :class:`~avalanche_color.training.strategy.StrategyBase` says.

        Args:
            model: a timm ``VisionTransformer``, of which the strategy builds its
                :class:`~avalanche_color.peers.l2p.model.L2PViT` on a copy (the ViT given stays as it was); or a
                :class:`~avalanche_color.peers.l2p.model.L2PViT` (a strategy's ``model``) to continue from: its own
                settings (``pool_size``, ``prompt_length``, ``top_n``, ``head_input``, ``class_masking``,
                ``prompt_init``, ``head_init``, ``batchwise_selection``) then apply, and one given another value is
                refused.
            config: all options as one :class:`~avalanche_color.peers.l2p.config.L2PConfig`; an option given here
                replaces its field.
        """
        options = dict(
            surrogate_weight=surrogate_weight, lr=lr, lr_batch_scaling=lr_batch_scaling,
            grad_clip_norm=grad_clip_norm, train_epochs=train_epochs, pool_size=pool_size,
            prompt_length=prompt_length, top_n=top_n, head_input=head_input, class_masking=class_masking,
            prompt_init=prompt_init, head_init=head_init, batchwise_selection=batchwise_selection,
            train_mb_size=train_mb_size, eval_mb_size=eval_mb_size, eval_every=eval_every, check_data=check_data,
            precision=precision, num_workers=num_workers, pin_memory=pin_memory,
            persistent_workers=persistent_workers)
        super().__init__(model=model, config=config, options=options, criterion=criterion, device=device,
                         plugins=plugins, evaluator=evaluator, template_options=template_options)

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
