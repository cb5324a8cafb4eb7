"""`moda_attention_into`: eager MoDA attention whose backward adds the depth K/V gradients into a
caller's buffers (`moda_bwd`'s `depth_grad_into`) instead of returning them.

For a model that keeps one depth-KV buffer and one depth gradient buffer (models.depth): each
layer's read of slots [a, b) hands the kernel those slots of the gradient buffer, and its
backward adds the layer's depth gradients there in the kernel (each entry has one owning
program: load, add, store). Without it the kernel writes a gradient tensor of the slice's size,
which the caller reads and adds into its buffer again: three times the kernel's own depth
gradient bytes, and the slice's size in transient memory at the deepest layer. Both backwards
(pointer passes and the descriptor one, Hopper's default) add in the kernel and read strided
depth slices in place.

The depth K/V stay inputs of the autograd node (their producers, e.g. a buffer read, run their
backward after this one, which orders the additions before anyone reads the buffer) but get no
gradient from it. in_kernel=False makes the addition after the kernel instead, as the buffer's
read would (A/B checks and timing). An eager autograd Function over
the same launches as `moda_attention` (`moda_fwd`, `moda_bwd`, the config resolved as its op
does); torch.compile takes `moda_attention`'s custom op instead.
"""
from __future__ import annotations

import math

import torch

from moda_bench.kernels.moda.config import MoDAConfig
from moda_bench.kernels.moda.triton import interface
from moda_bench.kernels.moda.validate import check_depth_grad_into, check_inputs
from moda_bench.kernels.oplib import config_key


def in_kernel_default(cfg: MoDAConfig) -> bool:
    """Whether a call adds its depth gradients in the kernel when not told: always, every backward
    placement has the mode (the pointer passes' and the descriptor backward's DEPTH_ACC, which
    reads and writes the strided slices in place through descriptors built with their strides)."""
    return True


class _MoDAInto(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, kd, vd, gk, gv, scale, config, in_kernel):
        q, k, v, kd, vd, (shape, cfg, usable) = interface.prepared(q, k, v, kd, vd, config)   # the op's own plan
        o, lse = interface.moda_fwd(q, k, v, kd, vd, scale, shape, cfg, usable=usable)
        ctx.save_for_backward(q, k, v, kd, vd, o, lse)
        in_kernel = in_kernel_default(cfg) if in_kernel is None else bool(in_kernel)
        ctx.into, ctx.call = (gk, gv), (scale, shape, cfg, usable, in_kernel)
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        if do is None:
            return (None,) * 10
        q, k, v, kd, vd, o, lse = ctx.saved_tensors
        scale, shape, cfg, usable, in_kernel = ctx.call
        if in_kernel:
            dq, dk, dv, _, _ = interface.moda_bwd(do, q, k, v, kd, vd, o, lse, scale, shape, cfg, usable=usable,
                                                  depth_grad_into=ctx.into)
        else:   # the backward's own gradient tensors, added here (what a buffer read's backward would do)
            dq, dk, dv, dkd, dvd = interface.moda_bwd(do, q, k, v, kd, vd, o, lse, scale, shape, cfg, usable=usable)
            ctx.into[0].add_(dkd)
            ctx.into[1].add_(dvd)
        return dq, dk, dv, None, None, None, None, None, None, None


def moda_attention_into(q, k, v, k_depth, v_depth, grad_k_depth, grad_v_depth, *, scale: float | None = None,
                        config: MoDAConfig | None = None, in_kernel: bool | None = None):
    """`moda_attention(q, k, v, k_depth, v_depth)` (out (B, T, Hq, d)) whose backward adds the
    gradients of k_depth, v_depth (B, T, L, Hk, d, L >= 1) into grad_k_depth, grad_v_depth (their
    shape, dtype and device, one set of strides with a unit last stride: e.g. slices of a
    model's depth gradient buffer) and gives k_depth, v_depth none. q, k, v get theirs.
    in_kernel: True adds them in the backward kernel (`moda_bwd`'s depth_grad_into), False after it;
    None (default): `in_kernel_default` of the call's config. Depth slices sharing one set of
    strides (unit last stride) are read in place, never copied (`interface.depth_views`)."""
    check_inputs(q, k, v, k_depth, v_depth, need_cuda=True)
    if k_depth is None or k_depth.shape[2] == 0:
        raise ValueError("moda_attention_into needs depth K/V (L >= 1); call moda_attention at L = 0")
    k_depth, v_depth = interface.depth_views(k_depth, v_depth)
    check_depth_grad_into((grad_k_depth, grad_v_depth), k_depth)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    o, _ = _MoDAInto.apply(q.contiguous(), k.contiguous(), v.contiguous(), k_depth, v_depth, grad_k_depth,
                           grad_v_depth, scale, config_key(config), in_kernel)
    return o
