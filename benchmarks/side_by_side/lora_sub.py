"""Our LoRA subtraction (:class:`avalanche_color.LoRASubtraction`) side by side with its authors' code on the
same weights and batches, in float64 on the CPU, and a table of the largest absolute differences.

    python -m benchmarks.side_by_side.lora_sub --authors-code /tmp/lorasub_code

``--authors-code`` is an extracted copy of scarlet0703/LoRA-Sub-DRS at 836ad29 (its fork
nqh-tq-32052503/LoRA-Sub-DRS has the same HEAD; ``git -C <mirror> archive HEAD | tar -x -C /tmp/lorasub_code``,
or ``git show HEAD:<file>`` per file where the archive stops at the two DomainNet split files that the mirror
lacks). Its modules are imported from there (``methods/lorasub_drs.py`` ``LoRAsub_DRS``,
``models/vit_lora.py`` ``Attention_LoRA``, ``models/sinet_lora.py`` ``ViT_lora_co`` and ``SiNet``,
``optimgrad/adam_proj.py`` ``Adam``, ``utils/losses.py`` ``AugmentedTripletLoss``); nothing of it is copied here.

How their code is driven. ``SiNet.__init__`` builds a pretrained ViT-B (``models/sinet_lora.py`` line 71,
``_create_vision_transformer('vit_base_patch16_224_in21k', pretrained=True)``, a download), so while
``LoRAsub_DRS.__init__`` runs, ``SiNet`` is a function that builds their ``SiNet`` object with their own
``ViT_lora_co`` at small dims (width 32, 2 blocks, 2 heads, 16 px images, patch 4) and their per-task
``classifier_pool``; ``LoRAsub_DRS.__init__`` then runs as written (their ``init_param`` of every component).
The backbone weights are our seeded timm ViT's, loaded by name. ``incremental_train`` is not called: it
builds its loaders from their data manager (``methods/lorasub_drs.py`` lines 77-83, a shuffled
``DataLoader``); its body is run instead: lines 71-73, then ``_train`` on a loader that replays the batches
our strategy trained on (first, for t > 0, the covariance pass over the experience), then ``_build_protos``
with a data manager stand-in that hands out each class's training images, then ``after_task``. Per
experience, the new component's A and B and the new head's rows are ours, copied into theirs before it
trains. ``ipdb`` (imported, unused) is a stub module. No CUDA call stops anything on CPU.

Compared: (a) the forward with 1-3 summed components and the subtracted network; (b) each block's input
covariance of the subtracted network and the projection (k and P); (c) their projected ``Adam`` against our
``ProjectedAdam`` on the same gradients (weight decay 0 and 0.01), and the whole training of two
experiences (every step's parameters, learning rates, the covariance and P at the task switch);
(d) the augmented triplet loss and its gradient; (e) the prototypes, the features and the nearest-mean
predictions.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional
from unittest.mock import patch

import numpy as np
import torch
from avalanche.benchmarks import tensors_benchmark
from avalanche.core import SupervisedPlugin
from avalanche.evaluation.metrics import accuracy_metrics
from avalanche.training.plugins import EvaluationPlugin
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor, nn

from avalanche_color.peers.lora_sub.config import LoRASubtractionConfig
from avalanche_color.peers.lora_sub.model import LoRASubtractionViT
from avalanche_color.peers.lora_sub.passes import subtracted_covariances
from avalanche_color.peers.lora_sub.projected_adam import ProjectedAdam
from avalanche_color.peers.lora_sub.projection import principal_projection
from avalanche_color.peers.lora_sub.strategy import LoRASubtraction
from avalanche_color.peers.lora_sub.triplet_loss import augmented_triplet_loss
from avalanche_color.peers.lora_sum.covariances import input_covariances
from avalanche_color.peers.lora_sum.layer import Mixing

THRESHOLD = 0.99  # hard-coded in their init_model_optimizer


# ---------------------------------------------------------------------- their code


def import_authors(path: Path) -> SimpleNamespace:
    """Their modules, imported from the extracted copy (``ipdb`` stubbed: imported, never called)."""
    if not (path / "methods" / "lorasub_drs.py").is_file():
        raise FileNotFoundError(f"--authors-code must be an extracted LoRA-Sub-DRS copy with methods/lorasub_drs.py, "
                                f"got {path}")
    sys.path.insert(0, str(path))
    sys.modules.setdefault("ipdb", types.ModuleType("ipdb"))
    import methods.lorasub_drs as drs  # noqa: E402  (their code, from --authors-code)
    import models.sinet_lora as sinet
    import models.vit_lora as vit_lora
    import optimgrad.adam_proj as adam_proj
    import utils.losses as losses

    return SimpleNamespace(drs=drs, sinet=sinet, vit_lora=vit_lora, adam=adam_proj, losses=losses)


@contextlib.contextmanager
def quiet() -> Iterator[io.StringIO]:
    """Their prints (``Parameters to be updated``, ``reserving basis``) and tqdm bars, kept aside."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        yield buffer


def their_network(authors: SimpleNamespace, vit: VisionTransformer, sizes: SimpleNamespace) -> Any:
    """Their ``SiNet`` with their ``ViT_lora_co`` at small dims, our ViT's weights loaded by name."""
    torch.set_default_dtype(torch.float64)
    try:
        encoder = authors.sinet.ViT_lora_co(img_size=sizes.image, patch_size=sizes.patch, embed_dim=sizes.width,
                                            depth=sizes.depth, num_heads=sizes.heads, num_classes=0,
                                            n_tasks=sizes.experiences, rank=sizes.rank)
        net = authors.sinet.SiNet.__new__(authors.sinet.SiNet)
        nn.Module.__init__(net)
        net.image_encoder = encoder
        net.class_num = sizes.classes
        net.classifier_pool = nn.ModuleList([nn.Linear(sizes.width, sizes.classes) for _ in range(sizes.experiences)])
        net.numtask = 0
    finally:
        torch.set_default_dtype(torch.float32)
    missing, unexpected = encoder.load_state_dict(vit.state_dict(), strict=False)
    missing = [k for k in missing if "lora_" not in k and not k.endswith("_grow")]
    if missing or unexpected:
        raise RuntimeError(f"our ViT's weights do not map onto their ViT_lora_co: missing {missing}, "
                           f"unexpected {unexpected}")
    return net.double()


def their_learner(authors: SimpleNamespace, vit: VisionTransformer, sizes: SimpleNamespace) -> Any:
    """``LoRAsub_DRS(args)`` from ``configs/cifar100.json`` with the stream's sizes, epochs, rates and the CPU."""
    args = {"prefix": "side_by_side", "dataset": "cifar100", "memory_size": 0, "memory_per_class": 0,
            "fixed_memory": True, "shuffle": False, "init_cls": sizes.classes, "increment": sizes.classes,
            "total_sessions": sizes.experiences, "model_name": "lorasub_drs", "net_type": "sip",
            "embd_dim": sizes.width, "EPSILON": 1e-8, "init_epoch": sizes.epochs, "optim": "Adam",
            "init_lr": sizes.lr, "init_lr_decay": 0.1, "init_weight_decay": 0.0, "epochs": sizes.epochs,
            "fc_lrate": sizes.head_lr, "lrate": sizes.lr, "lrate_decay": 0.1, "batch_size": sizes.batch,
            "weight_decay": 0.0, "rank": sizes.rank, "margin_inter": sizes.margin, "lambada": sizes.weight,
            "num_workers": 0, "eval": False, "device": [torch.device("cpu")]}
    with patch.object(authors.drs, "SiNet", lambda _: their_network(authors, vit, sizes)):
        return authors.drs.LoRAsub_DRS(args)


def their_attention(net: Any) -> list[Any]:
    return [block.attn for block in net.image_encoder.blocks]


# ---------------------------------------------------------------------- weights on both sides


def tiny_vit(sizes: SimpleNamespace) -> VisionTransformer:
    torch.manual_seed(sizes.seed)
    return VisionTransformer(img_size=sizes.image, patch_size=sizes.patch, embed_dim=sizes.width, depth=sizes.depth,
                             num_heads=sizes.heads, num_classes=0, global_pool="token").double().eval()


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


def our_component(state: dict[str, Tensor], t: int, depth: int) -> list[Tensor]:
    return [state[f"backbone.blocks.{b}.attn.qkv.components.{t}.{f}"] for b in range(depth) for f in "AB"]


def max_abs(a: Any, b: Any) -> float:
    if isinstance(a, (list, tuple)):
        return max((max_abs(x, y) for x, y in zip(a, b)), default=0.0)
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).abs().max()) if a.numel() else 0.0


def scale_of(a: Any) -> float:
    if isinstance(a, (list, tuple)):
        return max((scale_of(x) for x in a), default=0.0)
    a = torch.as_tensor(a, dtype=torch.float64)
    return float(a.abs().max()) if a.numel() else 0.0


# ---------------------------------------------------------------------- (a), (b), (c), (d) on their own


def compare_forward_and_subspace(authors: SimpleNamespace, vit: VisionTransformer, sizes: SimpleNamespace,
                                 rows: list[str]) -> None:
    """Three components with random B (not the tiny sparse init), the same images: the features of the
    network with components 0..t, the subtracted network of t, each block's covariance and P."""
    sizes3 = SimpleNamespace(**{**vars(sizes), "experiences": 3})
    model = LoRASubtractionViT(vit, LoRASubtractionConfig(rank=sizes.rank))
    generator = torch.Generator().manual_seed(sizes.seed + 1)
    for t in range(3):
        model.learn_classes(list(range(t * sizes.classes, (t + 1) * sizes.classes)))
        with torch.no_grad():
            for layer in model.layers:
                B = layer.components[t].B
                B.copy_(0.2 * torch.randn(B.shape, generator=generator, dtype=B.dtype))
        model.finish_component()
    net = their_network(authors, vit, sizes3).eval()
    for t in range(3):
        copy_component(model.state_dict(), net, t)
    images = torch.randn(sizes.per_class * 2, 3, sizes.image, sizes.image, generator=generator, dtype=torch.float64)
    ones = model._coefficients
    with torch.no_grad():
        for t in range(3):
            ours = model.features(images, Mixing(magnitudes=ones([1.0] * (t + 1) + [0.0] * (2 - t))))
            theirs = net.image_encoder(images, t)[0][:, 0]
            rows.append(row(f"(a) features, components 0..{t} summed", max_abs(ours, theirs), scale_of(ours)))
        for t in (1, 2):
            mixing = Mixing(magnitudes=ones([-1.0] * t + [0.0] * (3 - t)))
            with input_covariances(model.layers) as sums:
                ours = model.features(images, mixing)
            for attn in their_attention(net):
                attn.cur_matrix, attn.n_cur_matrix = torch.zeros(sizes.width, sizes.width), 0
            theirs = net.image_encoder(images, t, get_cur_x=True)[0][:, 0]
            rows.append(row(f"(a) subtracted network of t={t}, features", max_abs(ours, theirs), scale_of(ours)))
            covariances = [s.mean() for s in sums]
            theirs_cov = [attn.cur_matrix for attn in their_attention(net)]
            rows.append(row(f"(b) covariance per block, t={t}", max_abs(covariances, theirs_cov),
                            scale_of(covariances)))
            projections, ks = zip(*(principal_projection(c, THRESHOLD) for c in covariances))
            their_P, their_k = their_projections(authors, net, t, theirs_cov)
            rows.append(row(f"(b) P per block, t={t} (k ours {list(ks)}, theirs {their_k})",
                            max_abs(list(projections), their_P), scale_of(list(projections))))


def their_projections(authors: SimpleNamespace, net: Any, t: int, covariances: list[Tensor]
                      ) -> tuple[list[Tensor], list[int]]:
    """Their ``Adam.get_eigens`` and ``get_transforms`` over component t's A of k per block (the same P for
    its A of v and both B), fed each block's covariance as their ``_train`` does."""
    params = [attn.lora_A_k[t].weight for attn in their_attention(net)]
    for p in params:
        p.requires_grad_(True)
    optimizer = authors.adam.Adam([{"params": params, "svd": True, "lr": 1e-3, "thres": THRESHOLD}])
    with quiet():
        optimizer.get_eigens({p: c for p, c in zip(params, covariances)})
        optimizer.get_transforms()
    ks = []
    for p in params:
        s = optimizer.eigens[p]["eigen_value"]
        ks.append(int(((s.cumsum(0) / s.sum()) >= THRESHOLD).nonzero()[0][0]) + 1)
    return [optimizer.transforms[p] for p in params], ks


def compare_adam(authors: SimpleNamespace, sizes: SimpleNamespace, rows: list[str]) -> None:
    """Their Adam and our ProjectedAdam from the same start on the same gradients: A (two parts) projected on
    the right, B on the left, a head unprojected, with and without weight decay."""
    generator = torch.Generator().manual_seed(sizes.seed + 2)
    d, r = sizes.width, sizes.rank
    basis = torch.linalg.qr(torch.randn(d, d, generator=generator, dtype=torch.float64))[0][:, : d // 2]
    covariance = basis @ torch.diag(torch.linspace(3, 1, d // 2, dtype=torch.float64)) @ basis.T
    for weight_decay in (0.0, 0.01):
        A = torch.randn(2, r, d, generator=generator, dtype=torch.float64)
        B = torch.randn(2, d, r, generator=generator, dtype=torch.float64)
        head = torch.randn(sizes.classes, d, generator=generator, dtype=torch.float64)
        ours = [nn.Parameter(A.clone()), nn.Parameter(B.clone()), nn.Parameter(head.clone())]
        theirs = [nn.Parameter(A[0].clone()), nn.Parameter(A[1].clone()), nn.Parameter(B[0].clone()),
                  nn.Parameter(B[1].clone()), nn.Parameter(head.clone())]
        our_optimizer = ProjectedAdam([{"params": ours[:2], "lr": sizes.lr}, {"params": ours[2:], "lr": sizes.head_lr}],
                                      weight_decay=weight_decay)
        P, k = principal_projection(covariance, THRESHOLD)
        our_optimizer.project(ours[0], P, "right")
        our_optimizer.project(ours[1], P, "left")
        their_optimizer = authors.adam.Adam(
            [{"params": theirs[:4], "svd": True, "lr": sizes.lr, "thres": THRESHOLD},
             {"params": theirs[4:], "weight_decay": weight_decay, "lr": sizes.head_lr}],
            weight_decay=weight_decay, betas=(0.9, 0.999))
        with quiet():
            their_optimizer.get_eigens({p: covariance for p in theirs[:4]})
            their_optimizer.get_transforms()
        for _ in range(sizes.steps):
            grads = [torch.randn(p.shape, generator=generator, dtype=torch.float64) for p in ours]
            for p, g in zip(ours, grads):
                p.grad = g.clone()
            for p, g in zip(theirs, [grads[0][0], grads[0][1], grads[1][0], grads[1][1], grads[2]]):
                p.grad = g.clone()
            our_optimizer.step()
            their_optimizer.step()
        stacked = [torch.stack(theirs[:2]), torch.stack(theirs[2:4]), theirs[4]]
        moved = max_abs([p.detach() for p in ours], [A, B, head])
        rows.append(row(f"(c) projected Adam, {sizes.steps} steps, weight decay {weight_decay} (k {k}/{d})",
                        max_abs([p.detach() for p in ours], [p.detach() for p in stacked]), moved))


def compare_triplet(authors: SimpleNamespace, sizes: SimpleNamespace, rows: list[str]) -> None:
    """Their AugmentedTripletLoss and ours: value and gradient, without prototypes, with them, one class."""
    generator = torch.Generator().manual_seed(sizes.seed + 3)
    f = torch.randn(9, sizes.width, generator=generator, dtype=torch.float64)
    f = f / f.norm(dim=1, keepdim=True)
    y = torch.tensor([0, 0, 1, 1, 1, 2, 0, 2, 1])
    prototypes = 3 * torch.randn(4, sizes.width, generator=generator, dtype=torch.float64)
    classes = torch.tensor([0, 1, 3, 4])
    criterion = authors.losses.AugmentedTripletLoss(margin=sizes.margin)
    for label, labels, count in (("no prototypes", y, 0), ("4 prototypes", y, 4), ("one class, prototypes", y * 0, 4)):
        ours_f, theirs_f = f.clone().requires_grad_(), f.clone().requires_grad_()
        ours = augmented_triplet_loss(ours_f, labels, prototypes[:count], classes[:count], sizes.margin)
        centre = [p.numpy() for p in prototypes[:count]]  # their self._protos: a list of numpy means
        theirs = criterion(theirs_f, labels, np.array(centre) if count else centre)
        ours.backward()
        theirs.backward()
        rows.append(row(f"(d) triplet loss, {label} (value {float(ours):.4f})", max_abs(ours.detach(), theirs.detach()),
                        float(ours)))
        rows.append(row(f"(d) triplet loss gradient, {label}", max_abs(ours_f.grad, theirs_f.grad),
                        scale_of(ours_f.grad)))


# ---------------------------------------------------------------------- (c), (e): two experiences


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


def make_stream(sizes: SimpleNamespace) -> tuple[Any, list[tuple[Tensor, Tensor]]]:
    """Class-incremental, ``classes`` new classes per experience, each class a template plus noise."""
    generator = torch.Generator().manual_seed(sizes.seed + 4)
    count = sizes.classes * sizes.experiences
    templates = torch.randn(count, 3, sizes.image, sizes.image, generator=generator, dtype=torch.float64)
    train, test = [], []
    for e in range(sizes.experiences):
        labels = torch.arange(e * sizes.classes, (e + 1) * sizes.classes).repeat_interleave(sizes.per_class)
        for store in (train, test):
            noise = torch.randn(len(labels), 3, sizes.image, sizes.image, generator=generator, dtype=torch.float64)
            store.append((templates[labels] + 0.7 * noise, labels))
    return tensors_benchmark(train, test, task_labels=[0] * sizes.experiences), test


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


def compare_training(ours: dict[str, Any], theirs: dict[str, Any], sizes: SimpleNamespace, rows: list[str]) -> None:
    recorder: Recorder = ours["recorder"]
    for t in range(sizes.experiences):
        if t:
            our_cov, their_cov = recorder.covariances[t], theirs["covariances"][t - 1]
            rows.append(row(f"(b) exp {t}: covariance per block (training pass)", max_abs(our_cov, their_cov),
                            scale_of(our_cov)))
            our_P = list(recorder.start[t]["projections"])
            rows.append(row(f"(b) exp {t}: P per block (k ours {ours['ranks'][t - 1]})",
                            max_abs(our_P, theirs["projections"][t - 1]), scale_of(our_P)))
        our_steps, their_steps = recorder.steps[t], theirs["steps"][t]
        if len(our_steps) != len(their_steps):
            rows.append(f"exp {t}: {len(our_steps)} steps ours, {len(their_steps)} theirs")
            continue
        rows.append(row(f"(c) exp {t}: learning rates, {len(our_steps)} steps",
                        max_abs([s["lrs"] for s in our_steps], [s["lrs"] for s in their_steps]), sizes.head_lr))
        start = our_component(recorder.start[t], t, sizes.depth)
        for n in (0, 1, len(our_steps) - 1):
            ours_p, theirs_p = our_steps[n]["component"], their_steps[n]["component"]
            rows.append(row(f"(c) exp {t}: A and B after step {n + 1} (moved {max_abs(ours_p, start):.1e})",
                            max_abs(ours_p, theirs_p), scale_of(ours_p)))
        rows_of = slice(t * sizes.classes, (t + 1) * sizes.classes)
        ours_h = [our_steps[-1]["head"][0][rows_of], our_steps[-1]["head"][1][rows_of]]
        rows.append(row(f"(c) exp {t}: head rows after step {len(our_steps)}",
                        max_abs(ours_h, their_steps[-1]["head"]), scale_of(ours_h)))
        features = [s["features"] for s in our_steps]
        rows.append(row(f"(a) exp {t}: normalised training features, every step",
                        max_abs(features, [f for f, _ in theirs["triplet"][t]]), 1.0))
        our_triplet = [augmented_triplet_loss(s["features"], y, s["prototypes"], s["prototype_classes"], sizes.margin)
                       for s, (_, y) in zip(our_steps, [b for epoch in recorder.batches[t] for b in epoch])]
        their_triplet = [v for _, v in theirs["triplet"][t]]
        rows.append(row(f"(d) exp {t}: triplet loss, every step", max_abs(our_triplet, their_triplet),
                        scale_of(our_triplet)))
        end = recorder.end[t]
        if t:
            ours_0 = our_component(end, 0, sizes.depth)
            rows.append(f"(c) exp {t}: component 0 moved during it (ours): "
                        f"{max_abs(ours_0, our_component(recorder.start[t], 0, sizes.depth)):.1e}")
            rows.append(row(f"(c) exp {t}: component 0 at its end", max_abs(ours_0, their_component(theirs["net"], 0)),
                            scale_of(ours_0)))
        ours_protos = end["prototypes"]
        rows.append(row(f"(e) exp {t}: prototypes", max_abs(ours_protos, theirs["prototypes"][t]),
                        scale_of(ours_protos)))
        rows.append(row(f"(e) exp {t}: test features", max_abs(ours["features"][t], theirs["features"][t]),
                        scale_of(ours["features"][t])))
        same = int((ours["predictions"][t] == theirs["predictions"][t]).sum())
        rows.append(f"(e) exp {t}: nearest-mean predictions equal: {same}/{len(ours['predictions'][t])}")


def row(label: str, difference: float, scale: Optional[float] = None) -> str:
    scale_text = f"   (size {scale:.2e})" if scale is not None else ""
    return f"{label:<72} max |ours - theirs| = {difference:.2e}{scale_text}"


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--authors-code", type=Path, required=True,
                        help="an extracted copy of scarlet0703/LoRA-Sub-DRS at 836ad29")
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--rank", type=int, default=3)
    parser.add_argument("--classes", type=int, default=3, help="classes per experience")
    parser.add_argument("--per-class", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=5e-3, help="LoRA learning rate (their code: 5e-4)")
    parser.add_argument("--head-lr", type=float, default=2e-2, help="head learning rate (their code: 2e-3)")
    parser.add_argument("--margin", type=float, default=1.0)
    parser.add_argument("--weight", type=float, default=0.5, help="triplet weight lambda (their code: 0.05)")
    parser.add_argument("--steps", type=int, default=5, help="steps of the stand-alone Adam comparison")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sizes = SimpleNamespace(image=16, patch=4, experiences=2, **{k: v for k, v in vars(args).items()
                                                                  if k != "authors_code"})
    torch.set_num_threads(1)
    authors = import_authors(args.authors_code.resolve())
    vit = tiny_vit(sizes)
    rows: list[str] = []
    compare_forward_and_subspace(authors, vit, sizes, rows)
    compare_adam(authors, sizes, rows)
    compare_triplet(authors, sizes, rows)
    benchmark, test = make_stream(sizes)
    train = [(torch.stack([s[0] for s in e.dataset]), torch.tensor([int(s[1]) for s in e.dataset]))
             for e in benchmark.train_stream]
    ours = run_ours(vit, benchmark, test, sizes)
    theirs = run_theirs(authors, vit, ours, train, test, sizes)
    compare_training(ours, theirs, sizes, rows)
    print(f"LoRA subtraction, ours against scarlet0703/LoRA-Sub-DRS@836ad29, float64 CPU; ViT width {sizes.width}, "
          f"{sizes.depth} blocks, rank {sizes.rank}, {sizes.experiences} experiences x {sizes.classes} classes, "
          f"batch {sizes.batch}, {sizes.epochs} epochs, lr {sizes.lr}/{sizes.head_lr}, margin {sizes.margin}, "
          f"lambda {sizes.weight}")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
