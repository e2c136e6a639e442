"""The authors' Adam (``optimgrad/adam_proj.py``): Adam with the old-style bias correction, its update
projected onto each layer's principal input subspace.

Per step n of a parameter with gradient g (plus ``weight_decay * p`` when nonzero):
``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``,
``step = lr sqrt(1 - b2^n) / (1 - b1^n)``, ``u = -step m / (sqrt(v) + eps)`` (torch's Adam would put eps
after the bias correction). The moments see the raw gradient; the **update** is projected:
``A <- A + u P`` for a down matrix (its rows, the input side), ``B <- B + P u`` for an up matrix
(its output side, with the same input-side P, as the code does). Parameters without a projection
(the head, every parameter in the first experience) take ``u`` as it is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, Literal, Optional

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

Side = Literal["right", "left"]  # A (r x d): u P; B (d x r): P u


class ProjectedAdam(Optimizer):
    """Adam as the LoRA-subtraction code computes it, with per-parameter projections of its update.

    Args:
        params: parameters or parameter groups (each group may set ``lr`` and ``weight_decay``).
        lr, betas, eps, weight_decay: Adam's (weight decay as an L2 term added to the gradient).
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.projections: dict[nn.Parameter, tuple[Tensor, Side]] = {}

    def project(self, parameter: nn.Parameter, projection: Tensor, side: Side) -> None:
        """From now on, project ``parameter``'s update by ``projection`` on ``side``."""
        self.projections[parameter] = (projection, side)

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad if group["weight_decay"] == 0 else p.grad + group["weight_decay"] * p
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                m, v, n = state["exp_avg"], state["exp_avg_sq"], state["step"]
                m.mul_(beta1).add_(grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                step_size = group["lr"] * math.sqrt(1 - beta2 ** n) / (1 - beta1 ** n)
                update = -step_size * m / (v.sqrt() + group["eps"])
                if p in self.projections:
                    projection, side = self.projections[p]
                    projection = projection.to(update.dtype)
                    update = update @ projection if side == "right" else projection @ update
                p.add_(update)
        return loss
