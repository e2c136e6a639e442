"""Named settings of the comparison runner (``--preset paper``); explicit settings override them.
And the learning rates a run takes where neither a flag nor a preset gives one (:data:`UNTUNED_LRS`).

A preset's values are :class:`~avalanche_color.runner.config.RunConfig` fields. ``color_lr`` is
the lr of CoLoR (and of S-Prompts and Joint-LoRA, which train as CoLoR does); the fine-tuning
baselines keep ``baseline_lr``, L2P its paper's Adam settings; ``weight_decay`` goes to every SGD.

:data:`PAPER_PIPELINE` lists every setting of the paper's pipeline with its source: the CoLoR
paper (Wistuba et al., 2023), or, where it is silent, S-Prompts' published code
(github.com/iamwangyabin/S-Prompts, ``utils/data.py`` and ``methods/sprompt.py``), which the
paper's code base is built on (its Experiments section) and whose augmentation it adopts (its
appendix). The README's preset table is :func:`pipeline_table`.
"""

from __future__ import annotations

from typing import Any

BACKBONE = "vit_base_patch16_224.augreg_in21k"  # ViT-B/16 pretrained on ImageNet-21k, from timm

# Source: the CoLoR paper's appendix, "Training hyperparameters"; normalisation: S-Prompts' code.
PAPER: dict[str, dict[str, Any]] = {
    "split_cifar100": dict(ranks=(64,), ks=(20,), batch_size=128, epochs=50, color_lr=0.01, weight_decay=2e-4,
                           backbone=BACKBONE, normalisation="imagenet"),
    "core50": dict(ranks=(64,), ks=(5,), batch_size=128, epochs=20, color_lr=0.02, weight_decay=2e-4,
                   backbone=BACKBONE, normalisation="imagenet"),
    "domainnet": dict(ranks=(64,), ks=(5,), batch_size=128, epochs=50, color_lr=1e-3, weight_decay=2e-4,
                      backbone=BACKBONE, normalisation="imagenet"),
}

# The paper's protocol on the offline streams, as it gives it to the paper's benchmark of the same kind:
# PACS, domain-incremental, DomainNet's lr and k; Split Tiny-ImageNet, class-incremental, Split CIFAR-100's.
# Not the paper's backbone or normalisation: the streams run on the backbone a user gives (--backbone), with
# its own mean and std (ImageNet's on weights trained for 0.5 cost the frozen features a third of their
# nearest-class-mean accuracy; docs/fidelity.md), at its input size or --image-size.
OFFLINE_PROTOCOL = dict(ranks=(64,), batch_size=128, epochs=50, weight_decay=2e-4, augmentation="paper")
PAPER["pacs"] = dict(OFFLINE_PROTOCOL, ks=(5,), color_lr=1e-3)
PAPER["split_tiny_imagenet"] = dict(OFFLINE_PROTOCOL, ks=(20,), color_lr=0.01)

PRESETS: dict[str, dict[str, dict[str, Any]]] = {"paper": PAPER}

# The learning rates of a run that gives none (no --color-lr or --baseline-lr, no preset that sets them), by the
# backbone. The package's own small ViTs (--backbone offline or digits, pretrained at 32 px) hold large steps. On
# other pretrained weights those damage the features: on an ImageNet ViT-Ti, CoLoR at 0.05 ends at 48.6 on a
# class-incremental CIFAR-10 (its experts' task-label accuracy 89 -> 62) and at 0.01 at 69.7; --tune lr chose 0.01
# for CoLoR, S-Prompts and Joint-LoRA on both ViT-Ti tables and on PACS at the paper's protocol, and 1e-3 for every
# fine-tuning baseline (Naive's validation accuracy on PACS at 0.01: 18%, at 1e-3: 75%).
SHIPPED_BACKBONES = ("offline", "digits")  # load_backbone's names of the package's own ViTs
UNTUNED_LRS: dict[str, dict[str, float]] = {
    "shipped": dict(color_lr=0.05, baseline_lr=0.01),
    "pretrained": dict(color_lr=0.01, baseline_lr=1e-3),
}


def untuned_lrs(backbone: str) -> dict[str, float]:
    """``color_lr`` and ``baseline_lr`` of a run on ``backbone`` (load_backbone's spec) that gives none."""
    return UNTUNED_LRS["shipped" if backbone in SHIPPED_BACKBONES else "pretrained"]

PAPER_SECTION = "paper, Experiments"
APPENDIX = "paper, appendix 'Training hyperparameters'"
S_PROMPTS_DATA = "S-Prompts' code, `utils/data.py`"
S_PROMPTS_METHOD = "S-Prompts' code, `methods/sprompt.py`"

# (setting, value, source): the paper's pipeline point by point, as --preset paper runs it.
PAPER_PIPELINE: tuple[tuple[str, str, str], ...] = (
    ("backbone", f"ViT-B/16 pretrained on ImageNet-21k, timm `{BACKBONE}`", PAPER_SECTION),
    ("Split CIFAR-100", "10 experiences of 10 contiguous classes in CIFAR-100's order (0-9, 10-19, ...)",
     PAPER_SECTION),
    ("CORe50", "NI: 8 training sessions; one test set, the 3 held-out sessions (Avalanche's `CORe50(scenario='ni')`)",
     PAPER_SECTION),
    ("DomainNet", "6 experiences: clipart, infograph, painting, quickdraw, real, sketch, each with its published "
                  "train/test split file", S_PROMPTS_DATA),
    ("training transform", "RandomResizedCrop(224) (scale 0.08-1), RandomHorizontalFlip",
     f"{APPENDIX} (flips and random crops, adopted from S-Prompts); {S_PROMPTS_DATA}"),
    ("test transform", "Resize(256), CenterCrop(224)", S_PROMPTS_DATA),
    ("normalisation", "ImageNet's mean (0.485, 0.456, 0.406) and std (0.229, 0.224, 0.225); the backbone's own "
                      "is mean = std = 0.5 (`--normalisation backbone`)", f"{S_PROMPTS_DATA} (the paper is silent)"),
    ("optimiser", "SGD, momentum 0.9", f"{S_PROMPTS_METHOD} (the paper is silent)"),
    ("learning rate", "0.01 Split CIFAR-100, 0.02 CORe50, 1e-3 DomainNet; the offline streams as the paper's of "
                      "their kind: PACS (domain-incremental) DomainNet's, Split Tiny-ImageNet Split CIFAR-100's",
     APPENDIX),
    ("schedule", "cosine annealing to 0 over each experience, restarted per experience",
     f"{APPENDIX}; S-Prompts' code steps it once per epoch, this runner after every batch"),
    ("weight decay", "2e-4", APPENDIX),
    ("batch size", "128", APPENDIX),
    ("epochs per experience", "50; CORe50 20", APPENDIX),
    ("LoRA rank", "64", APPENDIX),
    ("prototypes k", "20 Split CIFAR-100 (2 x the new classes), 5 CORe50 and DomainNet; 5 PACS, 20 Split "
                     "Tiny-ImageNet", APPENDIX),
    ("offline streams (PACS, Split Tiny-ImageNet)", "the paper's optimiser, schedule, weight decay, batch, epochs, "
     "rank, k and training transform (`--augmentation paper`), on the backbone given and with its own "
     "normalisation", "this package: the protocol of the paper's benchmark of the same kind"),
)


def pipeline_table() -> str:
    """:data:`PAPER_PIPELINE` as the README's markdown table."""
    lines = ["| setting | value | source |", "|---|---|---|"]
    lines += [f"| {setting} | {value} | {source} |" for setting, value, source in PAPER_PIPELINE]
    return "\n".join(lines)


def preset_settings(preset: str, benchmark: str) -> dict[str, Any]:
    """The settings ``preset`` gives ``benchmark`` (RunConfig fields); refuses what it does not cover."""
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
    if benchmark not in PRESETS[preset]:
        raise ValueError(f"preset {preset!r} has no settings for benchmark {benchmark!r}; "
                         f"it has them for {sorted(PRESETS[preset])}")
    return dict(PRESETS[preset][benchmark])
