"""The prompt-tuning peers of the paper: S-Prompts (one prompt expert per experience, routed by
k prototypes as CoLoR, trained with CoLoR's SGD and lr, so the two differ only in the expert) and
L2P (prompts picked from a shared pool, with its paper's Adam, lr and prompt sizes)."""

from __future__ import annotations

from typing import Any

from avalanche_color.runner.methods import Method, MethodRun, package_strategy

S_PROMPTS_LENGTH = 10
L2P_OPTIONS = dict(pool_size=10, prompt_length=5, top_n=5, lr=0.03)


def _s_prompts_options(run: MethodRun) -> dict[str, Any]:
    return dict(prompt_length=S_PROMPTS_LENGTH, lr=run.config.color_lr, k=run.k,
                prototypes_per_class=run.config.prototypes_per_class, **run.weight_decay, **run.precision)


METHODS = (
    Method("S-Prompts", _s_prompts_options, package_strategy("SPrompts"), prototypes=True, frozen_backbone=True,
           distributed=True, lr_chosen_by="--color-lr, as CoLoR"),
    Method("L2P", lambda run: dict(L2P_OPTIONS, **run.precision), package_strategy("L2P"), frozen_backbone=True,
           lr_chosen_by="its paper's Adam lr 0.03 (its code also scales it by batch / 256: not done here)"),
)
