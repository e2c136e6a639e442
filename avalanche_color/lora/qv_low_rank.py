"""The q and v low-rank update as kernels: added in place onto a fused qkv output (``_add_qv_update_``), and
``linear`` plus that update with a backward that computes only what is needed (:class:`QVLowRankLinear`)."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable


def _add_qv_update_(out: Tensor, low: Tensor, B: Tensor, scaling: float) -> None:
    """``out[:, q] += s low_q B_q^T`` and ``out[:, v] += s low_v B_v^T``, in place on 2-d ``out``."""
    d, r = B.shape[1], B.shape[2]
    out[:, :d].addmm_(low[:, :r], B[0].T, alpha=scaling)
    out[:, 2 * d :].addmm_(low[:, r:], B[1].T, alpha=scaling)


class QVLowRankLinear(torch.autograd.Function):
    """``linear(x, W, b)`` plus the q and v LoRA updates, with a backward that does only what is needed.

    Forward: the frozen matmul, then ``x A^T`` (both parts in one matmul) and one
    thin matmul per part added in place onto the q and v columns of the output.
    Backward, with ``g`` the output gradient and ``g_q``, ``g_v`` its q and v columns
    (views): ``dlow = s [g_q B_q | g_v B_v]``, ``dx = g W + dlow A`` (one addmm),
    ``dA = dlow^T x``, ``dB = s g^T low``; ``W`` and ``b`` get gradients only if
    they require them (a frozen backbone's do not). Autograd through the plain
    composition would instead multiply by the zero key block of a fused
    ``[B_q 0; 0 0; 0 B_v]`` in both directions.
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, A: Tensor, B: Tensor, scaling: float) -> Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        out = nn.functional.linear(x2, weight, bias)
        low = x2 @ A.reshape(-1, A.shape[-1]).T
        _add_qv_update_(out, low, B, scaling)
        ctx.save_for_backward(x2, weight, A, B, low)
        ctx.scaling = scaling
        ctx.has_bias = bias is not None
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        x2, weight, A, B, low = ctx.saved_tensors
        s = ctx.scaling
        d, r = B.shape[1], B.shape[2]
        g = grad.reshape(-1, grad.shape[-1])
        g_q, g_v = g[:, :d], g[:, 2 * d :]
        need_x, need_w, need_b, need_a, need_b_lora = ctx.needs_input_grad[:5]
        dx = dw = db = da = dB = None
        if need_x or need_a:
            dlow = torch.cat((g_q @ B[0], g_v @ B[1]), dim=1).mul_(s)
            A2 = A.reshape(2 * r, -1)
            if need_x:
                dx = torch.addmm(g @ weight, dlow, A2).view(*grad.shape[:-1], x2.shape[-1])
            if need_a:
                da = (dlow.T @ x2).view(A.shape)
        if need_b_lora:
            dB = torch.stack((g_q.T @ low[:, :r], g_v.T @ low[:, r:])).mul_(s)
        if need_w:
            dw = g.T @ x2
        if need_b and ctx.has_bias:
            db = g.sum(0)
        return dx, dw, db, da, dB, None
