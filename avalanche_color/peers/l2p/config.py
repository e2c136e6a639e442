"""L2P's options: its prompt pool and head (the model's options) and the whole method's config.

The option groups it shares with the other methods (training, loaders) and the checks are in
:mod:`avalanche_color.config`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from avalanche_color.config import LoaderOptions, Options, TrainingOptions, option
from avalanche_color.utils.checks import boolean, non_negative, one_of, positive, positive_int

HeadInput = Literal["prompts", "pooled"]
PromptInit = Literal["uniform", "zero"]
HEAD_INPUTS: tuple[str, ...] = HeadInput.__args__  # type: ignore[attr-defined]
PROMPT_INITS: tuple[str, ...] = PromptInit.__args__  # type: ignore[attr-defined]


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
        prompt_init: ``"uniform"`` in [-1, 1] (L2P's default) or ``"zero"``.
    """

    pool_size: int = option(10, positive_int, expert_setting=True)
    prompt_length: int = option(5, positive_int, expert_setting=True)
    top_n: int = option(5, positive_int, expert_setting=True)
    head_input: HeadInput = option("prompts", one_of(HEAD_INPUTS), expert_setting=True)
    class_masking: bool = option(True, boolean)
    prompt_init: PromptInit = option("uniform", one_of(PROMPT_INITS))

    def _check_together(self) -> None:
        if self.top_n > self.pool_size:
            raise ValueError(f"top_n must be at most pool_size={self.pool_size}, got top_n={self.top_n}")


@dataclass(frozen=True, kw_only=True)
class L2PConfig(LoaderOptions, L2PModelOptions, TrainingOptions):
    """L2P's options, the fields of :class:`~avalanche_color.L2P`'s keyword arguments; defaults from
    the L2P paper (Split CIFAR-100): Adam, constant lr 0.03, batch 128, 5 epochs; the surrogate
    weight 0.1 is its code's ``pull_constraint_coeff``.

    Attributes:
        surrogate_weight: lambda, the weight of the key-query surrogate loss.
    """

    surrogate_weight: float = option(0.1, non_negative)
    lr: float = option(0.03, positive)
    train_epochs: int = option(5, positive_int)
