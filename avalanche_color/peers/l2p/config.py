"""L2P's options: its prompt pool and head (the model's options) and the whole method's config.

The option groups it shares with the other methods (training, loaders) and the checks are in
:mod:`avalanche_color.config`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from avalanche_color.config import LoaderOptions, Options, TrainingOptions, option
from avalanche_color.utils.checks import boolean, non_negative, one_of, optional, positive, positive_int

HeadInput = Literal["prompts", "pooled"]
PromptInit = Literal["uniform", "zero", "code"]
HeadInit = Literal["linear", "zero"]
BatchwiseSelection = Literal["never", "training", "always"]
HEAD_INPUTS: tuple[str, ...] = HeadInput.__args__  # type: ignore[attr-defined]
PROMPT_INITS: tuple[str, ...] = PromptInit.__args__  # type: ignore[attr-defined]
HEAD_INITS: tuple[str, ...] = HeadInit.__args__  # type: ignore[attr-defined]
BATCHWISE_SELECTIONS: tuple[str, ...] = BatchwiseSelection.__args__  # type: ignore[attr-defined]
# L2P's code scales its learning rate by the global batch over this (train_continual.py,
# base_learning_rate = config.learning_rate * global_batch_size / 256.0).
LR_REFERENCE_BATCH = 256


@dataclass(frozen=True, kw_only=True)
class L2PModelOptions(Options):
    """L2P's prompt pool and head.

    Attributes:
        pool_size: M, prompts in the pool (L2P: 10).
        prompt_length: L_p, tokens per prompt (L2P: 5).
        top_n: N, prompts chosen per sample (L2P: 5); at most ``pool_size``.
        head_input: ``"prompts"`` (mean of the prompt positions' outputs, L2P) or
            ``"pooled"`` (the ViT's own pooled feature with prompts in the sequence).
        class_masking: in training, mask the logits of classes outside the current experience.
        prompt_init: ``"uniform"`` in [-1, 1] (Avalanche's port; L2P's code draws from flax's
            ``uniform()``, [0, 0.01)), ``"zero"``, or ``"code"`` (prompts and keys in [0, 0.01), as the code).
        head_init: ``"linear"``: new head rows as ``nn.Linear``'s, classes never trained at ``-inf``
            (Avalanche's port); ``"zero"``: rows start at zero and classes never trained score 0 at
            evaluation, as the code's fixed head over every class (its untrained rows stay zero).
        batchwise_selection: ``"never"``: each sample uses its own ``top_n`` prompts (Avalanche's
            port's default); ``"always"``: every sample of a batch uses the ``top_n`` prompts the
            batch's samples chose most often (ties: the lower index), in training and at
            evaluation, as L2P's code (``batchwise_prompt=True``; it votes within each device's
            batch of 16); ``"training"``: batchwise in training, per sample at evaluation.
    """

    pool_size: int = option(10, positive_int, expert_setting=True)
    prompt_length: int = option(5, positive_int, expert_setting=True)
    top_n: int = option(5, positive_int, expert_setting=True)
    head_input: HeadInput = option("prompts", one_of(HEAD_INPUTS), expert_setting=True)
    class_masking: bool = option(True, boolean)
    prompt_init: PromptInit = option("uniform", one_of(PROMPT_INITS))
    head_init: HeadInit = option("linear", one_of(HEAD_INITS))
    batchwise_selection: BatchwiseSelection = option("never", one_of(BATCHWISE_SELECTIONS))

    def _check_together(self) -> None:
        if self.top_n > self.pool_size:
            raise ValueError(f"top_n must be at most pool_size={self.pool_size}, got top_n={self.top_n}")


@dataclass(frozen=True, kw_only=True)
class L2PConfig(LoaderOptions, L2PModelOptions, TrainingOptions):
    """L2P's options, the fields of :class:`~avalanche_color.L2P`'s keyword arguments; defaults from
    the L2P paper (Split CIFAR-100): Adam, constant lr 0.03, batch 128, 5 epochs; the surrogate
    weight 0.1 is Avalanche's port's ``sim_coefficient`` (L2P's code: ``pull_constraint_coeff``
    1.0 for Split CIFAR-100). With the defaults L2P trains as Avalanche's ``LearningToPrompt``
    does; ``grad_clip_norm=1.0``, ``batchwise_selection="always"`` and ``lr_batch_scaling=True``
    restore what L2P's code does besides.

    Attributes:
        surrogate_weight: lambda, the weight of the key-query surrogate loss.
        lr_batch_scaling: Adam's learning rate is ``lr * train_mb_size / 256`` (L2P's code scales
            ``learning_rate`` by its global batch / 256); False: ``lr`` itself (Avalanche's port).
        grad_clip_norm: before each update, scale the gradients of the trained parameters so that
            their global L2 norm is at most this (L2P's code: ``grad_clip_max_norm=1.0``, its norm
            also counting the frozen ViT's gradients); None: no clipping (Avalanche's port).
    """

    surrogate_weight: float = option(0.1, non_negative)
    lr: float = option(0.03, positive)
    lr_batch_scaling: bool = option(False, boolean)
    grad_clip_norm: Optional[float] = option(None, optional(positive))
    train_epochs: int = option(5, positive_int)

    @property
    def adam_lr(self) -> float:
        """The learning rate Adam runs with: ``lr``, times ``train_mb_size / 256`` with ``lr_batch_scaling``."""
        return self.lr * self.train_mb_size / LR_REFERENCE_BATCH if self.lr_batch_scaling else self.lr
