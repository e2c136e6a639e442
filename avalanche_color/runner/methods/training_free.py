"""Baselines that train nothing on the frozen backbone: NCM (the nearest class mean of its
normalised features, SimpleCIL) and RanPAC (a closed-form ridge over random ReLU features,
``ridge_width`` wide). A plugin fits each classifier after every experience."""

from __future__ import annotations

from typing import Any

from avalanche_color.runner.methods import Method, MethodRun


def _build_ncm(run: MethodRun, options: dict[str, Any]):
    import torch
    from avalanche.models import TrainEvalModel
    from torch import nn

    from avalanche_color.runner.methods.ncm import ClassMeanUpdate, SeenClassesNCM, TrainingFree

    vit, ncm = run.backbone(0).requires_grad_(False), SeenClassesNCM(**options)
    # No forward in training: the NCM is both classifiers. The optimiser, which the template needs, never steps.
    return TrainingFree(model=TrainEvalModel(vit, train_classifier=ncm, eval_classifier=ncm),
                        optimizer=torch.optim.SGD(vit.parameters(), lr=run.config.baseline_lr),
                        criterion=nn.CrossEntropyLoss(), plugins=[ClassMeanUpdate()], **run.strategy_options)


def _build_ranpac(run: MethodRun, options: dict[str, Any]):
    import torch
    from torch import nn

    from avalanche_color.runner.methods.ncm import TrainingFree
    from avalanche_color.runner.methods.ranpac import RanPACModel, RidgeUpdate

    model = RanPACModel(run.backbone(0), run.num_classes, options["width"])
    return TrainingFree(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=run.config.baseline_lr),
                        criterion=nn.CrossEntropyLoss(), plugins=[RidgeUpdate()], **run.strategy_options)


METHODS = (
    Method("NCM", lambda run: dict(normalize=True), _build_ncm),
    Method("RanPAC", lambda run: dict(width=run.config.ridge_width), _build_ranpac),
)
