"""(a)-(d) each on its own, both sides from the same start: the forward and the subtracted network, the
covariance and P, the projected Adam, the augmented triplet loss and its gradient."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor, nn

from avalanche_color.peers.lora_sub.config import LoRASubtractionConfig
from avalanche_color.peers.lora_sub.model import LoRASubtractionViT
from avalanche_color.peers.lora_sub.strategy import ProjectedAdam, augmented_triplet_loss, principal_projection
from avalanche_color.peers.lora_sum.model import Mixing, input_covariances
from benchmarks.side_by_side.lora_sub.authors_code import THRESHOLD, quiet, their_attention, their_network
from benchmarks.side_by_side.lora_sub.table import max_abs, row, scale_of
from benchmarks.side_by_side.lora_sub.weights import copy_component


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
