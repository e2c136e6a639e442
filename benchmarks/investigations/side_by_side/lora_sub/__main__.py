"""Our LoRA subtraction (:class:`avalanche_color.LoRASubtraction`) side by side with its authors' code on the
same weights and batches, in float64 on the CPU, and a table of the largest absolute differences.

    python -m benchmarks.investigations.side_by_side.lora_sub --authors-code /tmp/lorasub_code

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
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import numpy as np
import torch
from avalanche.benchmarks import tensors_benchmark
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor, nn

from avalanche_color.peers.lora_sub.config import LoRASubtractionConfig
from avalanche_color.peers.lora_sub.model import LoRASubtractionViT
from avalanche_color.peers.lora_sub.strategy import ProjectedAdam, augmented_triplet_loss, principal_projection
from avalanche_color.peers.lora_sum.model import Mixing, input_covariances
from benchmarks.investigations.side_by_side.lora_sub.authors_code import (THRESHOLD, import_authors, quiet,
                                                                          their_attention, their_network)
from benchmarks.investigations.side_by_side.lora_sub.our_run import Recorder, run_ours
from benchmarks.investigations.side_by_side.lora_sub.their_run import copy_component, run_theirs, their_component


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


def tiny_vit(sizes: SimpleNamespace) -> VisionTransformer:
    """The seeded ViT both sides start from, in float64."""
    torch.manual_seed(sizes.seed)
    return VisionTransformer(img_size=sizes.image, patch_size=sizes.patch, embed_dim=sizes.width, depth=sizes.depth,
                             num_heads=sizes.heads, num_classes=0, global_pool="token").double().eval()


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


# The rows: the largest absolute difference between ours and theirs, and the size of ours.
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


def row(label: str, difference: float, scale: Optional[float] = None) -> str:
    scale_text = f"   (size {scale:.2e})" if scale is not None else ""
    return f"{label:<72} max |ours - theirs| = {difference:.2e}{scale_text}"


# (a)-(d) each on its own, both sides from the same start: the forward and the subtracted network, the
# covariance and P, the projected Adam, the augmented triplet loss and its gradient.
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


# (a)-(e) over the two experiences' training: the rows comparing what each side did, step by step.
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


def our_component(state: dict[str, Tensor], t: int, depth: int) -> list[Tensor]:
    """Our component t (from a state dict of our model) in :func:`their_component`'s layout: A and B per block."""
    return [state[f"backbone.blocks.{b}.attn.qkv.components.{t}.{f}"] for b in range(depth) for f in "AB"]


if __name__ == "__main__":
    main()
