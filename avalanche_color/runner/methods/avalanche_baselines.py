"""Avalanche's fine-tuning strategies on the whole ViT (SGD, ``baseline_lr``): Naive, the paper's
"FT + class masking" (FT-masked), EWC, LwF, Replay, and Joint-FT (Avalanche's JointTraining on
all experiences at once, an upper bound)."""

from __future__ import annotations

from typing import Any

from avalanche_color.runner.methods import Method, MethodRun

EWC_LAMBDA = 100.0
LWF_ALPHA, LWF_TEMPERATURE = 1.0, 2.0
REPLAY_MEMORY = 200


def _options(**own: Any):
    def options(run: MethodRun) -> dict[str, Any]:
        return dict(lr=run.config.baseline_lr, momentum=0.9, weight_decay=run.config.weight_decay or 0.0, **own)
    return options


def _strategy(template: str, masked: bool = False):
    def build(run: MethodRun, options: dict[str, Any]):
        import torch
        from avalanche import training
        from torch import nn

        if masked:
            from avalanche.models import IncrementalClassifier
            from avalanche.models.utils import FeatureExtractorModel

            from avalanche_color import CurrentClassesMasking

            vit = run.backbone(0)
            head = IncrementalClassifier(vit.num_features, run.num_classes, masking=True, mask_value=float("-inf"))
            model: nn.Module = FeatureExtractorModel(vit, head)
            plugins = [CurrentClassesMasking(head)]
        else:
            model, plugins = run.backbone(run.num_classes), []
        sgd = {name: options[name] for name in ("lr", "momentum", "weight_decay")}
        own = {name: value for name, value in options.items() if name not in sgd}
        return getattr(training, template)(model=model, optimizer=torch.optim.SGD(model.parameters(), **sgd),
                                           criterion=nn.CrossEntropyLoss(), plugins=plugins, **own,
                                           **run.strategy_options)
    return build


LR_CHOICE = "--baseline-lr (default 0.01, one value for every fine-tuning baseline)"

METHODS = (
    Method("Naive", _options(), _strategy("Naive"), lr_chosen_by=LR_CHOICE),
    Method("FT-masked", _options(), _strategy("Naive", masked=True), lr_chosen_by=LR_CHOICE),
    Method("EWC", _options(ewc_lambda=EWC_LAMBDA), _strategy("EWC"), lr_chosen_by=LR_CHOICE),
    Method("LwF", _options(alpha=LWF_ALPHA, temperature=LWF_TEMPERATURE), _strategy("LwF"), lr_chosen_by=LR_CHOICE),
    Method("Replay", _options(mem_size=REPLAY_MEMORY), _strategy("Replay"), lr_chosen_by=LR_CHOICE),
    Method("Joint-FT", _options(), _strategy("JointTraining"), joint=True, lr_chosen_by=LR_CHOICE),
)
