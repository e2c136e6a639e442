"""L2P's options: its prompt pool and head (the model's options) and the whole method's config.

The option groups it shares with the other methods (training, loaders) and the checks are in
:mod:`avalanche_color.config`.
"""

from __future__ import annotations

from typing import Literal, Optional, get_args

from avalanche_color.config import LoaderOptions, TrainingOptions
from avalanche_color.utils.checks import (Options, boolean, non_negative, one_of, option, option_group, optional,
                                          positive, positive_int)

HeadInput = Literal["prompts", "pooled"]
PromptInit = Literal["uniform", "zero", "code"]
HeadInit = Literal["linear", "zero"]
BatchwiseSelection = Literal["never", "training", "always"]
HEAD_INPUTS: tuple[str, ...] = get_args(HeadInput)
PROMPT_INITS: tuple[str, ...] = get_args(PromptInit)
HEAD_INITS: tuple[str, ...] = get_args(HeadInit)
BATCHWISE_SELECTIONS: tuple[str, ...] = get_args(BatchwiseSelection)
# L2P's code scales its learning rate by the global batch over this (train_continual.py,
# base_learning_rate = config.learning_rate * global_batch_size / 256.0).
LR_REFERENCE_BATCH = 256


@option_group
class L2PModelOptions(Options):
    """L2P's prompt pool and head."""

    pool_size: int = option(10, positive_int, expert_setting=True, doc="M, prompts in the pool (L2P: 10).")
    prompt_length: int = option(5, positive_int, expert_setting=True, doc="L_p, tokens per prompt (L2P: 5).")
    top_n: int = option(5, positive_int, expert_setting=True,
                        doc="N, prompts chosen per sample (L2P: 5); at most ``pool_size``.")
    head_input: HeadInput = option(
        "prompts", one_of(HEAD_INPUTS), expert_setting=True,
        doc='``"prompts"`` (the mean of the prompt positions\' outputs, L2P) or ``"pooled"`` (the ViT\'s own '
            'pooled feature with prompts in the sequence).')
    class_masking: bool = option(
        True, boolean, doc="in training, mask the logits of the classes outside the current experience.")
    prompt_init: PromptInit = option(
        "uniform", one_of(PROMPT_INITS),
        doc='``"uniform"`` in [-1, 1] (Avalanche\'s port; L2P\'s code draws from flax\'s ``uniform()``, '
            '[0, 0.01)), ``"zero"``, or ``"code"`` (prompts and keys in [0, 0.01), as the code).')
    head_init: HeadInit = option(
        "linear", one_of(HEAD_INITS),
        doc='``"linear"``: new head rows as ``nn.Linear``\'s, classes never trained at ``-inf`` (Avalanche\'s '
            'port); ``"zero"``: rows start at zero and classes never trained score 0 at evaluation, as the '
            'code\'s fixed head over every class (its untrained rows stay zero).')
    batchwise_selection: BatchwiseSelection = option(
        "never", one_of(BATCHWISE_SELECTIONS),
        doc='``"never"``: each sample uses its own ``top_n`` prompts (Avalanche\'s port\'s default); '
            '``"always"``: every sample of a batch uses the ``top_n`` prompts the batch\'s samples chose most '
            'often (ties: the lower index), in training and at evaluation, as L2P\'s code '
            '(``batchwise_prompt=True``, ``models/prompt.py``; it votes within each device\'s batch of 16); '
            '``"training"``: batchwise in training, per sample at evaluation.')

    def _check_together(self) -> None:
        if self.top_n > self.pool_size:
            raise ValueError(f"top_n must be at most pool_size={self.pool_size}, got top_n={self.top_n}")


@option_group
class L2PConfig(L2PModelOptions, TrainingOptions, LoaderOptions):
    """L2P's options, the keyword arguments of :class:`~avalanche_color.L2P`; defaults from
    the L2P paper (Split CIFAR-100): Adam, constant lr 0.03, batch 128, 5 epochs; the surrogate
    weight 0.1 is Avalanche's port's ``sim_coefficient`` (L2P's code: ``pull_constraint_coeff``
    1.0 for Split CIFAR-100). With the defaults L2P trains as Avalanche's ``LearningToPrompt``
    does; ``grad_clip_norm=1.0``, ``batchwise_selection="always"`` and ``lr_batch_scaling=True``
    restore what L2P's code does besides."""

    surrogate_weight: float = option(0.1, non_negative, doc="lambda, the weight of the key-query surrogate loss.")
    lr: float = option(0.03, positive, doc="Adam's learning rate, constant (the L2P paper: 0.03).")
    lr_batch_scaling: bool = option(
        False, boolean,
        doc="Adam runs with ``lr * train_mb_size / 256``, as L2P's code scales its learning rate by its global "
            "batch / 256 (``train_continual.py``); False: ``lr`` itself (Avalanche's port).")
    grad_clip_norm: Optional[float] = option(
        None, optional(positive),
        doc="before each update, scale the gradients of the trained parameters (pool and head) so that their "
            "global L2 norm is at most this, as L2P's code (``grad_clip_max_norm=1.0``, ``train_continual.py`` "
            "``train_step``; its norm also counts the frozen ViT's gradients, which it computes); None: no "
            "clipping (Avalanche's port).")
    train_epochs: int = option(5, positive_int)

    @property
    def adam_lr(self) -> float:
        """The learning rate Adam runs with: ``lr``, times ``train_mb_size / 256`` with ``lr_batch_scaling``."""
        return self.lr * self.train_mb_size / LR_REFERENCE_BATCH if self.lr_batch_scaling else self.lr
