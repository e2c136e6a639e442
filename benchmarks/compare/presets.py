"""Named settings of the comparison runner (``--preset paper``); explicit settings override them.

A preset's values are :class:`~benchmarks.compare.config.ComparisonConfig` fields. ``color_lr`` is
the lr of CoLoR (and of S-Prompts and Joint-LoRA, which train as CoLoR does); the fine-tuning
baselines keep ``baseline_lr``, L2P its paper's Adam settings; ``weight_decay`` goes to every SGD.
"""

from __future__ import annotations

from typing import Any

BACKBONE = "vit_base_patch16_224.augreg_in21k"  # ViT-B/16 pretrained on ImageNet-21k, from timm

# Source: the CoLoR paper's appendix, "Training hyperparameters" (Wistuba et al., 2023).
PAPER: dict[str, dict[str, Any]] = {
    "split_cifar100": dict(ranks=(64,), ks=(20,), batch_size=128, epochs=50, color_lr=0.01, weight_decay=2e-4,
                           backbone=BACKBONE),
    "core50": dict(ranks=(64,), ks=(5,), batch_size=128, epochs=20, color_lr=0.02, weight_decay=2e-4,
                   backbone=BACKBONE),
    "domainnet": dict(ranks=(64,), ks=(5,), batch_size=128, epochs=50, color_lr=1e-3, weight_decay=2e-4,
                      backbone=BACKBONE),
}

PRESETS: dict[str, dict[str, dict[str, Any]]] = {"paper": PAPER}


def preset_settings(preset: str, benchmark: str) -> dict[str, Any]:
    """The settings ``preset`` gives ``benchmark`` (ComparisonConfig fields); refuses what it does not cover."""
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
    if benchmark not in PRESETS[preset]:
        raise ValueError(f"preset {preset!r} has no settings for benchmark {benchmark!r}; "
                         f"it has them for {sorted(PRESETS[preset])}")
    return dict(PRESETS[preset][benchmark])
