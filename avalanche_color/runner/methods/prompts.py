"""The prompt-tuning peers of the paper: S-Prompts (one prompt expert per experience, routed by
k prototypes as CoLoR, trained with CoLoR's SGD and lr, so the two differ only in the expert) and
L2P (prompts picked from a shared pool, with its paper's Adam, lr and prompt sizes)."""

from __future__ import annotations

from typing import Any

from avalanche_color.runner.methods import Method, MethodRun

S_PROMPTS_LENGTH = 10
L2P_OPTIONS = dict(pool_size=10, prompt_length=5, top_n=5, lr=0.03)


def _s_prompts_options(run: MethodRun) -> dict[str, Any]:
    return dict(prompt_length=S_PROMPTS_LENGTH, lr=run.config.color_lr, k=run.k,
                prototypes_per_class=run.config.prototypes_per_class, **run.weight_decay, **run.precision)


def _build_s_prompts(run: MethodRun, options: dict[str, Any]):
    from avalanche_color import SPrompts

    return SPrompts(run.backbone(0), **options, **run.strategy_options)


def _build_l2p(run: MethodRun, options: dict[str, Any]):
    from avalanche_color import L2P

    return L2P(run.backbone(0), **options, **run.strategy_options)


METHODS = (
    Method("S-Prompts", _s_prompts_options, _build_s_prompts, prototypes=True, frozen_backbone=True,
           distributed=True, lr_chosen_by="--color-lr, as CoLoR"),
    Method("L2P", lambda run: dict(L2P_OPTIONS, **run.precision), _build_l2p, frozen_backbone=True,
           lr_chosen_by="its paper's Adam lr 0.03 (its code also scales it by batch / 256: not done here)"),
)
