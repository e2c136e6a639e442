"""Our :class:`~avalanche_color.peers.lora_sub.strategy.LoRASubtraction` trained on the stream, and what it did
(:class:`Recorder`)."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import torch
from avalanche.core import SupervisedPlugin
from avalanche.evaluation.metrics import accuracy_metrics
from avalanche.training.plugins import EvaluationPlugin
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor

from avalanche_color.peers.lora_sub.strategy import LoRASubtraction, subtracted_covariances
from benchmarks.investigations.side_by_side.lora_sub.authors_code import THRESHOLD


class Recorder(SupervisedPlugin):
    """Per experience of our strategy: the state after the model adaptation and the projection, the
    covariances, every batch per epoch, every step's learning rates and trained parameters, the features,
    the prototypes at the end."""

    def __init__(self) -> None:
        super().__init__()
        self.start: list[dict[str, Tensor]] = []
        self.covariances: list[list[Tensor]] = []
        self.batches: list[list[list[tuple[Tensor, Tensor]]]] = []
        self.steps: list[list[dict[str, Any]]] = []
        self.end: list[dict[str, Tensor]] = []

    def before_training_exp(self, strategy: Any, **kwargs: Any) -> None:
        model = strategy.model
        self.start.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        self.covariances.append(subtracted_covariances(strategy, **kwargs) if model.num_experts > 1 else [])
        self.batches.append([])
        self.steps.append([])

    def before_training_epoch(self, strategy: Any, **kwargs: Any) -> None:
        self.batches[-1].append([])

    def before_backward(self, strategy: Any, **kwargs: Any) -> None:
        self.batches[-1][-1].append((strategy.mb_x.detach().clone(), strategy.mb_y.detach().clone()))
        features = strategy.mb_features.detach()
        self.steps[-1].append(dict(features=features / features.norm(dim=1, keepdim=True),
                                   prototypes=strategy.model.prototypes.clone(),
                                   prototype_classes=strategy.model.prototype_classes.clone()))

    def before_update(self, strategy: Any, **kwargs: Any) -> None:  # the rates this step uses
        self.steps[-1][-1]["lrs"] = [g["lr"] for g in strategy.optimizer.param_groups]

    def after_update(self, strategy: Any, **kwargs: Any) -> None:
        model, t = strategy.model, strategy.model.num_experts - 1
        step = self.steps[-1][-1]
        step["component"] = [p.detach().clone() for layer in model.layers for p in layer.components[t].parameters()]
        step["head"] = (model.head_weight.detach().clone(), model.head_bias.detach().clone())

    def after_training_exp(self, strategy: Any, **kwargs: Any) -> None:
        self.end.append({k: v.detach().clone() for k, v in strategy.model.state_dict().items()})


def run_ours(vit: VisionTransformer, benchmark: Any, test: list, sizes: SimpleNamespace) -> dict[str, Any]:
    recorder = Recorder()
    strategy = LoRASubtraction(
        model=copy.deepcopy(vit), rank=sizes.rank, lr=sizes.lr, head_lr=sizes.head_lr, margin=sizes.margin,
        triplet_weight=sizes.weight, train_mb_size=sizes.batch, train_epochs=sizes.epochs, eval_mb_size=64,
        threshold=THRESHOLD, plugins=[recorder], evaluator=EvaluationPlugin(accuracy_metrics(stream=True), loggers=[]))
    predictions, features = [], []
    for e, experience in enumerate(benchmark.train_stream):
        strategy.train(experience)
        model = strategy.model.eval()
        images = torch.cat([x for x, _ in test[: e + 1]])
        with torch.no_grad():
            features.append(model.features(images))
            predictions.append(model(images).argmax(1))
    return dict(recorder=recorder, model=strategy.model, ranks=strategy.subspace_ranks, predictions=predictions,
                features=features)
