"""Learning to Prompt (L2P, Wang et al., CVPR 2022) on any timm ViT, as an Avalanche strategy.

The project's own implementation of the paper, not Avalanche's ``LearningToPrompt``:
that one builds its ViT from a fixed list of 224 px model names, hard-codes
768-wide heads, keeps a second full ViT for the queries and fails with timm 1.x.
Here the user's ViT is used as it is (width, depth, image size and prefix
tokens read from the model), and the query is the same frozen ViT run
without prompts.
"""

# No `from __future__ import annotations`: help() and inspect.signature show the evaluated types.
from collections.abc import Sequence
from typing import Any, Callable, ClassVar, Optional, Union

import torch
from avalanche.core import BasePlugin
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.plugins.evaluation import default_evaluator
from torch import Tensor, nn

from avalanche_color.config import Precision
from avalanche_color.peers.l2p.config import (BatchwiseSelection, HeadInit, HeadInput, L2PConfig, L2PModelOptions,
                                             PromptInit)
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
    ``grad_clip_norm=1.0``, ``batchwise_selection="always"``, ``lr_batch_scaling=True``. Every
    option is a field of :class:`~avalanche_color.peers.l2p.config.L2PConfig` with the same default.
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
        *,
        config: Optional[L2PConfig] = None,
        pool_size: int = 10,
        prompt_length: int = 5,
        top_n: int = 5,
        head_input: HeadInput = "prompts",
        class_masking: bool = True,
        prompt_init: PromptInit = "uniform",
        head_init: HeadInit = "linear",
        batchwise_selection: BatchwiseSelection = "never",
        surrogate_weight: float = 0.1,
        lr: float = 0.03,
        lr_batch_scaling: bool = False,
        grad_clip_norm: Optional[float] = None,
        train_mb_size: int = 128,
        train_epochs: int = 5,
        check_data: bool = True,
        eval_mb_size: int = 128,
        eval_every: int = -1,
        precision: Precision = "32-true",
        num_workers: int = 0,
        pin_memory: Optional[bool] = None,
        persistent_workers: bool = False,
        criterion: Optional[nn.Module] = None,
        device: Union[str, torch.device] = "cpu",
        plugins: Optional[Sequence[BasePlugin]] = None,
        evaluator: Union[EvaluationPlugin, Callable[[], EvaluationPlugin]] = default_evaluator,
        **kwargs: Any,
    ) -> None:
        """
        Args:
            model: a timm ``VisionTransformer`` (frozen, not changed), or an
                :class:`~avalanche_color.L2PViT` to continue from: then its own options (the pool
                and head options) apply, and giving one a value other than its default and the
                model's is refused.
            config: all options as one :class:`~avalanche_color.peers.l2p.config.L2PConfig`;
                options given beside it with a value other than their default replace its fields.
            pool_size: M, prompts in the pool (L2P: 10).
            prompt_length: L_p, tokens per prompt (L2P: 5).
            top_n: N, prompts chosen per sample (L2P: 5); at most ``pool_size``.
            head_input: ``"prompts"`` (mean of the prompt positions' outputs, L2P) or
                ``"pooled"`` (the ViT's own pooled feature with prompts in the sequence).
            class_masking: in training, mask the logits of classes outside the current experience.
            prompt_init: ``"uniform"`` in [-1, 1] (Avalanche's port; L2P's code draws from
                flax's ``uniform()``, [0, 0.01)), ``"zero"``, or ``"code"`` (prompts and keys in
                [0, 0.01), as the code).
            head_init: ``"linear"``: new head rows as ``nn.Linear``'s, classes never trained at
                ``-inf`` (Avalanche's port); ``"zero"``: rows start at zero and classes never trained
                score 0 at evaluation, as the code's fixed head over every class.
            batchwise_selection: ``"never"``: each sample uses its own ``top_n`` prompts
                (Avalanche's port's default); ``"always"``: every sample of a batch uses the
                ``top_n`` prompts the batch's samples chose most often (ties: the lower index), in
                training and at evaluation, as L2P's code (``batchwise_prompt=True``,
                models/prompt.py); ``"training"``: batchwise in training, per sample at evaluation.
            surrogate_weight: lambda, the weight of the key-query surrogate loss.
            lr: Adam's learning rate (constant).
            lr_batch_scaling: Adam runs with ``lr * train_mb_size / 256``, as L2P's code scales its
                learning rate by its global batch / 256 (train_continual.py); False: ``lr``.
            grad_clip_norm: before each update, scale the gradients of the trained parameters (pool
                and head) so that their global L2 norm is at most this, as L2P's code
                (``grad_clip_max_norm=1.0``, train_continual.py ``train_step``; its norm also counts
                the frozen ViT's gradients, which it computes); None: no clipping.
            train_mb_size: training mini-batch size.
            train_epochs: epochs per experience.
            check_data: scan each training experience for bad samples (non-finite pixels, labels that
                are not class ids) before the model changes for it; empty experiences, non-finite
                evaluation pixels and a non-finite loss are refused either way
                (:mod:`avalanche_color.training.data_checks`).
            eval_mb_size: evaluation mini-batch size.
            eval_every: Avalanche's periodic evaluation during training: every that many epochs
                (or iterations, with ``peval_mode="iteration"``); 0: at the end of each experience
                only; -1: never.
            precision: ``"32-true"`` (float32); ``"bf16-mixed"`` or ``"16-mixed"``: each forward and its loss
                under bfloat16 or float16 autocast, the trained weights kept float32 (float16 with a gradient
                scaler; see :class:`~avalanche_color.training.strategy.MixedPrecision`). A ViT given in bfloat16 stays so (half its
                memory); the prompt pool, keys and head are float32 beside it all the same.
            num_workers: DataLoader worker processes of every loader (0: in this process).
            pin_memory: page-locked batches; None: when the device is CUDA.
            persistent_workers: keep the workers between epochs (needs ``num_workers`` >= 1).
            criterion: the classification loss; a new ``CrossEntropyLoss`` by default.
            device: where the model trains and evaluates.
            plugins: Avalanche plugins (the list is copied, never changed); plugins that cannot
                act on L2P are refused with the reason.
            evaluator: Avalanche's ``EvaluationPlugin`` (or a factory of one).
            **kwargs: other keywords of Avalanche's ``SupervisedTemplate`` (``peval_mode``, ...).
        """
        # Every option above, by name: the fields of L2PConfig (tests/test_signatures.py).
        options = {name: value for name, value in locals().items() if name in L2PConfig.names()}
        options, kwargs = self.checked_options(model, config, options, plugins, kwargs)
        super().__init__(model=model, config=L2PConfig.build(config, **options), criterion=criterion,
                         device=device, plugins=plugins, evaluator=evaluator, template_options=kwargs)

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
