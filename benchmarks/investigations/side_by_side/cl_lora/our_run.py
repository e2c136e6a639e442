"""Our :class:`~avalanche_color.peers.cl_lora.strategy.CLLoRA` trained on the stream, and what it did, under the
names both sides are compared by."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import torch
from avalanche.core import SupervisedPlugin
from avalanche.evaluation.metrics import accuracy_metrics
from avalanche.training.plugins import EvaluationPlugin
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor

from avalanche_color.peers.cl_lora.model import CLLoRAViT
from avalanche_color.peers.cl_lora.strategy import CLLoRA, orthogonality_loss

Named = dict[str, Tensor]  # tensors under our names; theirs are mapped onto them by their_run.their_named


def our_named(model: CLLoRAViT) -> Named:
    bank, heads = model.adapters, model.experiences
    out: Named = {}
    for i, adapter in enumerate(bank.shared):
        out[f"shared.{i}.down"], out[f"shared.{i}.up"] = adapter.down, adapter.up
        if model.num_experts > 1 or heads.training_experience() is None:
            out[f"teacher.{i}.up"] = bank.teacher_up[i]
    for e, adapters in enumerate(bank.specific):
        for j, adapter in enumerate(adapters):
            out[f"specific.{e}.{j}.down"], out[f"specific.{e}.{j}.up"] = adapter.down, adapter.up
        out[f"block_weights.{e}"] = bank.block_weights[e]
        out[f"proxy.{e}.weight"], out[f"proxy.{e}.sigma"] = heads.proxy_weights[e], heads.proxy_sigmas[e]
    return out


def snapshot(named: Named) -> Named:
    return {k: v.detach().clone() for k, v in named.items()}


class Recorder(SupervisedPlugin):
    """What our strategy did: per experience its batches, its state before the first step and after each
    batch, and for the first batch the loss terms, both steps' gradients and the features."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: dict[int, list[tuple[Tensor, Tensor]]] = defaultdict(list)
        self.start: dict[int, Named] = {}
        self.steps: dict[int, list[Named]] = defaultdict(list)
        self.first: dict[int, dict[str, Any]] = {}
        self.shared_gradients: dict[int, list[tuple[float, float]]] = defaultdict(list)  # (|KD|, |CE|) per batch

    def before_update(self, strategy: CLLoRA, **kwargs: Any) -> None:
        model = strategy.model
        e = model.training_experience()
        assert e is not None
        x, y = strategy.mb_x.detach().clone(), strategy.mb_y.detach().clone()
        self.batches[e].append((x, y))
        if strategy.kd_loss is not None:
            shared = {id(a.up) for a in model.adapters.shared}
            parameters = list(model.trainable_parameters())
            kd = [g for p, g in zip(parameters, strategy._kd_gradients) if id(p) in shared and g is not None]
            ce = [p.grad for p in parameters if id(p) in shared and p.grad is not None]
            self.shared_gradients[e].append((float(torch.stack([g.norm() for g in kd]).norm()),
                                             float(torch.stack([g.norm() for g in ce]).norm())))
        if e in self.start:
            return
        named = our_named(model)
        self.start[e] = snapshot(named)
        ids = {id(v): k for k, v in named.items()}
        parameters = list(model.trainable_parameters())
        second = {ids[id(p)]: p.grad.detach().clone() for p in parameters if p.grad is not None}
        first = {}
        if strategy.kd_loss is not None:
            first = {ids[id(p)]: g.detach().clone() for p, g in zip(parameters, strategy._kd_gradients)
                     if g is not None}
        bank = model.adapters
        record = dict(ce=strategy._criterion(strategy.mb_output, strategy.mb_y).item(),
                      logits=strategy.mb_output[:, model.experiences.class_ids(e)].detach().clone(),
                      kd=None if strategy.kd_loss is None else strategy.kd_loss.item(),
                      ortho=orthogonality_loss(list(bank.block_weights[:e]), bank.block_weights[e]).item(),
                      step1=first, step2=second)
        with torch.no_grad():
            features = {f"network of experience {i}": model.experience_features(x, i) for i in range(e + 1)}
            if e:
                features["KD student (shared blocks, norm)"] = model.pooled(bank.shared_tokens(model.blocks,
                                                                                             model.tokens(x)))
                features["KD teacher"] = model.teacher_features(x)
        record["features"] = features
        self.first[e] = record

    def after_training_iteration(self, strategy: CLLoRA, **kwargs: Any) -> None:
        self.steps[strategy.model.training_experience()].append(snapshot(our_named(strategy.model)))


def run_ours(vit: VisionTransformer, benchmark: Any, test: list, sizes: SimpleNamespace) -> dict[str, Any]:
    recorder = Recorder()
    strategy = CLLoRA(vit, rank=sizes.rank, train_epochs=sizes.epochs, train_mb_size=sizes.batch, eval_mb_size=64,
                      lr=sizes.lr, momentum=0.9, weight_decay=sizes.weight_decay, plugins=[recorder],
                      evaluator=EvaluationPlugin(accuracy_metrics(stream=True), loggers=[]), device="cpu")
    results: dict[str, Any] = dict(recorder=recorder, end={}, prototypes={}, eval={})
    for e, experience in enumerate(benchmark.train_stream):
        strategy.train(experience, shuffle=False)
        model = strategy.model
        results["end"][e] = snapshot(our_named(model))
        results["prototypes"][e] = model.experiences.prototypes[model.experiences.rows(e)].detach().clone()
        model.eval()
        with torch.no_grad():
            x = torch.cat([t[0] for t in test[:e + 1]])
            results["eval"][e] = model(x)[:, :sizes.classes * (1 if sizes.stream == "domain" else e + 1)]
    return results
