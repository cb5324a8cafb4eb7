"""`moda_route_into`: `moda_attention_into`'s contract (the depth K/V gradients added into a caller's
buffers, none returned to the depth K/V) over whichever implementation the dispatcher chose.

A model that keeps one depth-KV buffer and one depth-gradient buffer (models.depth) hands each
layer's attention a slice of both. The Triton kernel adds the depth gradients itself
(`triton.accumulate.moda_attention_into`); the other implementations ("fa4", "overlap", "fused",
`dispatch.IMPLS`) return them, so here the chosen route runs on detached leaves of the five
inputs inside an autograd Function, and that Function's backward takes the route's own gradients
(`torch.autograd.grad` over the route's graph, built in the forward) and adds the depth ones
into the buffer slices, as accumulate's not-in-kernel branch does. The depth K/V stay inputs of
the node (their producers, e.g. a buffer read, run their backward after this one) and get no
gradient; q, k, v get theirs. The route's graph is freed by the backward (one backward per
forward, as a training step runs it). Eager only: torch.compile takes `moda_attention`'s custom op.
"""
from __future__ import annotations

import math

import torch

from moda_bench.kernels.moda import dispatch
from moda_bench.kernels.moda.triton.accumulate import moda_attention_into
from moda_bench.kernels.moda.validate import check_depth_grad_into, check_inputs


class _RouteInto(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, kd, vd, gk, gv, choice, scale):
        leaves = tuple(t.detach().requires_grad_() for t in (q, k, v, kd, vd))
        with torch.enable_grad():   # the route's own autograd graph, walked by the backward below
            o = dispatch.run(choice, *leaves, scale=scale, return_lse=False, depth_grad=True)
        ctx.inner, ctx.into = (o, leaves), (gk, gv)
        return o.detach()

    @staticmethod
    def backward(ctx, do):
        if ctx.inner is None:
            raise RuntimeError("moda_route_into: a second backward through the same forward (the route's graph "
                               "was freed by the first)")
        o, leaves = ctx.inner
        ctx.inner = None
        dq, dk, dv, dkd, dvd = torch.autograd.grad(o, leaves, do)
        ctx.into[0].add_(dkd)
        ctx.into[1].add_(dvd)
        return dq, dk, dv, None, None, None, None, None, None


def moda_route_into(choice: dispatch.Choice, q, k, v, k_depth, v_depth, grad_k_depth, grad_v_depth, *,
                    scale: float | None = None, in_kernel: bool | None = None):
    """`moda_attention(q, k, v, k_depth, v_depth, impl=choice.impl)` (out (B, T, Hq, d)) whose
    backward adds the gradients of k_depth, v_depth (B, T, L, Hk, d, L >= 1) into grad_k_depth,
    grad_v_depth (their shape, dtype and device: e.g. slices of a model's depth gradient buffer)
    and gives k_depth, v_depth none. choice: a `dispatch.choose` answer; "triton" is
    `moda_attention_into` (in_kernel goes to it), any other implementation runs through
    `dispatch.run` (module docstring)."""
    if choice.impl == "triton":
        return moda_attention_into(q, k, v, k_depth, v_depth, grad_k_depth, grad_v_depth, scale=scale,
                                   in_kernel=in_kernel)
    if choice.impl not in dispatch.IMPLS:
        raise ValueError(f"moda_route_into: impl must be one of {', '.join(dispatch.IMPLS)}, got {choice.impl!r}")
    check_inputs(q, k, v, k_depth, v_depth, need_cuda=True)
    if k_depth is None or k_depth.shape[2] == 0:
        raise ValueError("moda_route_into needs depth K/V (L >= 1); call moda_attention at L = 0")
    check_depth_grad_into((grad_k_depth, grad_v_depth), k_depth)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return _RouteInto.apply(q, k, v, k_depth, v_depth, grad_k_depth, grad_v_depth, choice, scale)
