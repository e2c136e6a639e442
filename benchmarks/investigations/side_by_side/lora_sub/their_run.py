"""Their ``LoRAsub_DRS`` driven through the stream on the batches our strategy trained on (our new component and
head rows copied in first), and what it did: every step, the covariances and P, the triplet loss's inputs,
the prototypes, features and predictions; our component copied into theirs and theirs read in our layout."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any
from unittest.mock import patch

import numpy as np
import torch
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor

from benchmarks.investigations.side_by_side.lora_sub.authors_code import quiet, their_attention, their_learner
from benchmarks.investigations.side_by_side.lora_sub.our_run import Recorder


@torch.no_grad()
def copy_component(state: dict[str, Tensor], net: Any, t: int) -> None:
    """Our component t (from a state dict of our model) into their ``lora_{A,B}_{k,v}[t]``."""
    for block, attn in enumerate(their_attention(net)):
        prefix = f"backbone.blocks.{block}.attn.qkv.components.{t}."
        for index, part in enumerate("kv"):
            getattr(attn, f"lora_A_{part}")[t].weight.copy_(state[prefix + "A"][index])
            getattr(attn, f"lora_B_{part}")[t].weight.copy_(state[prefix + "B"][index])


def their_component(net: Any, t: int) -> list[Tensor]:
    """A of k and v, B of k and v, per block, stacked as ours (2, r, d) and (2, d, r)."""
    out = []
    for attn in their_attention(net):
        out.append(torch.stack([attn.lora_A_k[t].weight, attn.lora_A_v[t].weight]).detach().clone())
        out.append(torch.stack([attn.lora_B_k[t].weight, attn.lora_B_v[t].weight]).detach().clone())
    return out


class ReplayLoader:
    """Their ``train_loader``: each iteration (their covariance pass, then each epoch) yields the next recorded
    pass as ``(index, images, labels)`` batches."""

    def __init__(self, passes: list[list[tuple[Tensor, Tensor]]]) -> None:
        self.passes = list(passes)
        self.length = len(passes[-1])

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        for x, y in self.passes.pop(0):
            yield torch.arange(len(y)), x, y


class ClassData:
    """Their data manager's ``get_dataset(..., ret_data=True)`` for ``_build_protos``: one class's training
    images, as their ``mode='test'`` (no augmentation here on either side)."""

    def __init__(self, train: list[tuple[Tensor, Tensor]]) -> None:
        self.x = torch.cat([x for x, _ in train])
        self.y = torch.cat([y for _, y in train])

    def get_dataset(self, indices: np.ndarray, source: str, mode: str, ret_data: bool = False) -> Any:
        keep = torch.isin(self.y, torch.as_tensor(indices))
        dataset = torch.utils.data.TensorDataset(torch.arange(int(keep.sum())), self.x[keep], self.y[keep])
        return (self.x[keep].numpy(), self.y[keep].numpy(), dataset) if ret_data else dataset


def run_theirs(authors: SimpleNamespace, vit: VisionTransformer, ours: dict[str, Any], train: list, test: list,
               sizes: SimpleNamespace) -> dict[str, Any]:
    recorder: Recorder = ours["recorder"]
    learner = their_learner(authors, vit, sizes)
    net = learner._network
    steps: list[list[dict[str, Any]]] = []
    covariances: list[list[Tensor]] = []
    projections: list[list[Tensor]] = []
    triplet_calls: list[list[tuple[Tensor, Tensor]]] = []

    original_init_optimizer = learner.init_model_optimizer
    original_transforms = learner.update_optim_transforms

    def init_model_optimizer() -> None:  # theirs, its step() watched
        original_init_optimizer()
        optimizer = learner.model_optimizer
        step = optimizer.step

        def watched_step(closure: Any = None) -> Any:
            lrs = [g["lr"] for g in optimizer.param_groups]
            result = step(closure)
            t = learner._cur_task
            steps[-1].append(dict(lrs=lrs, component=their_component(net, t),
                                  head=(net.classifier_pool[t].weight.detach().clone(),
                                        net.classifier_pool[t].bias.detach().clone())))
            return result

        optimizer.step = watched_step

    def update_optim_transforms() -> None:  # theirs, its covariances and P kept
        t = learner._cur_task
        keys = [attn.lora_A_k[t].weight for attn in their_attention(net)]
        covariances.append([learner.fea_in[k].clone() for k in keys])
        original_transforms()
        projections.append([learner.model_optimizer.transforms[k].clone() for k in keys])

    class WatchedTriplet(authors.losses.AugmentedTripletLoss):  # their loss, its inputs and value kept
        def forward(self, inputs: Tensor, targets: Tensor, center: Any) -> Tensor:
            loss = super().forward(inputs, targets, center)
            triplet_calls[-1].append((inputs.detach().clone(), loss.detach().clone()))
            return loss

    learner.init_model_optimizer = init_model_optimizer
    learner.update_optim_transforms = update_optim_transforms
    learner.data_manager = ClassData(train)
    features, predictions, prototypes = [], [], []
    with patch.object(authors.drs, "AugmentedTripletLoss", WatchedTriplet), quiet():
        for t in range(sizes.experiences):
            # incremental_train's lines 71-73, then _train on our batches, then _build_protos and after_task.
            learner._cur_task += 1
            learner._total_classes = learner._known_classes + sizes.classes
            net.update_fc(learner._total_classes)
            start = recorder.start[t]
            copy_component(start, net, t)
            rows = slice(t * sizes.classes, (t + 1) * sizes.classes)
            with torch.no_grad():
                net.classifier_pool[t].weight.copy_(start["head_weight"][rows])
                net.classifier_pool[t].bias.copy_(start["head_bias"][rows])
            steps.append([])
            triplet_calls.append([])
            epochs = recorder.batches[t]
            passes = ([[b for epoch in epochs[:1] for b in epoch]] if t else []) + epochs
            learner._train(ReplayLoader(passes), None)
            learner._build_protos()
            learner.after_task()
            prototypes.append(np.array(learner._protos))
            images = torch.cat([x for x, _ in test[: t + 1]])
            loader = [(torch.arange(len(images)), images, torch.cat([y for _, y in test[: t + 1]]))]
            with torch.no_grad():
                features.append(net.extract_vector(images))
            protos = np.array(learner._protos)
            predicted, _ = learner._eval_model(loader, protos / np.linalg.norm(protos, axis=1)[:, None])
            predictions.append(torch.as_tensor(predicted[:, 0]))
    return dict(net=net, steps=steps, covariances=covariances, projections=projections, triplet=triplet_calls,
                features=features, predictions=predictions, prototypes=prototypes)
