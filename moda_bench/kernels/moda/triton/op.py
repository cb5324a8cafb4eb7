"""`moda_attention` as torch custom ops (namespace `moda_bench`), so that torch.compile traces it.

`torch.ops.moda_bench.moda_attention(q, k, v, k_depth?, v_depth?, scale, depth_grad, config)
-> (out, lse)` runs the fused forward (`interface.moda_fwd`); `moda_bench::moda_attention_bwd`
the backward launches (`interface.moda_bwd`), wired as the forward's autograd formula. Both
have fake implementations (output shapes and dtypes only), so `torch.compile(fullgraph=True)`
sees them as single graph nodes and AOTAutograd traces the backward through the second op.

A custom op takes tensors, scalars and strings, not `MoDAConfig` objects: the public wrapper
passes `oplib.config_key(config)` ("" for none, else the config's JSON, memoised per object and
a constant under dynamo), and the op resolves it (`resolved`: the key's config, or with "" the
installed config source / shipped configs / heuristic default, as `resolve_config` does), so
tuning keeps working inside compiled code. Eager calls take `EagerMoDA`, an autograd Function
over the same implementation (`oplib.through_ops` says why). depth_grad is a forward argument the forward ignores:
its autograd formula reads it (with which inputs need gradients) to pick the detached backward.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from moda_bench.kernels.moda.config import MoDAConfig, check_config, resolve_config
from moda_bench.kernels.moda.triton import interface as _k
from moda_bench.kernels.moda.validate import check_inputs
from moda_bench.kernels.oplib import config_key, config_of

__all__ = ["moda_attention_op", "moda_attention_bwd_op", "EagerMoDA", "config_key", "resolved"]


def resolved(shape, dtype, key: str) -> MoDAConfig:
    """The config a call runs (`resolve_config` of the key's config), checked."""
    cfg = resolve_config(shape, dtype, config_of(key, MoDAConfig))
    check_config(cfg, shape.G)
    if "persist" in (cfg.fwd_depth, cfg.bwd_depth):
        raise ValueError("config placement 'persist' is moda_fa4's (a sequence kernel beside the streaming depth "
                         "kernels); moda_attention takes split, stream, fused, overlap or tma")
    return cfg


def _prepared(q, k, v, kd, vd, key):
    """(q, k, v, kd, vd, shape, cfg) as the launches take them (the wrapper's layout rules again, so
    the op is right for any strides it is handed, e.g. by opcheck)."""
    shape = check_inputs(q, k, v, kd, vd, need_cuda=True)
    kd, vd = _k.depth_views(kd, vd) if shape.L > 0 else (None, None)
    return q.contiguous(), k.contiguous(), v.contiguous(), kd, vd, shape, resolved(shape, q.dtype, key)


def _forward(q, k, v, k_depth, v_depth, scale: float, config: str):
    """out, lse of one call (`moda_fwd`): the op's implementation and the eager Function's forward."""
    q, k, v, kd, vd, shape, cfg = _prepared(q, k, v, k_depth, v_depth, config)
    usable = (cfg.fwd_depth == "tma" or cfg.bwd_depth == "tma") and _k.tma_usable(q, k, v, kd, vd, shape.L)
    return _k.moda_fwd(q, k, v, kd, vd, scale, shape, cfg, usable=usable)


def _gradients(do, q, k, v, k_depth, v_depth, o, lse, scale: float, depth_grad: bool, config: str):
    """(dq, dk, dv, dkd, dvd) of one call (`moda_bwd`); dkd = dvd = None without depth_grad or at L = 0."""
    q, k, v, kd, vd, shape, cfg = _prepared(q, k, v, k_depth, v_depth, config)
    usable = (cfg.fwd_depth == "tma" or cfg.bwd_depth == "tma") and _k.tma_usable(q, k, v, kd, vd, shape.L)
    return _k.moda_bwd(do, q, k, v, kd, vd, o, lse, scale, shape, cfg, depth_grad=depth_grad and shape.L > 0,
                       usable=usable)


@torch.library.custom_op("moda_bench::moda_attention", mutates_args=())
def moda_attention_op(q: Tensor, k: Tensor, v: Tensor, k_depth: Optional[Tensor], v_depth: Optional[Tensor],
                      scale: float, depth_grad: bool, config: str) -> tuple[Tensor, Tensor]:
    """out (B,T,Hq,d) in q's dtype and lse (B,T,Hq) float32 of one MoDA call (`moda_fwd`)."""
    return _forward(q, k, v, k_depth, v_depth, scale, config)


@moda_attention_op.register_fake
def _(q, k, v, k_depth, v_depth, scale, depth_grad, config):
    B, T, Hq, _d = q.shape
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty((B, T, Hq), dtype=torch.float32)


@torch.library.custom_op("moda_bench::moda_attention_bwd", mutates_args=())
def moda_attention_bwd_op(do: Tensor, q: Tensor, k: Tensor, v: Tensor, k_depth: Optional[Tensor],
                          v_depth: Optional[Tensor], o: Tensor, lse: Tensor, scale: float, depth_grad: bool,
                          config: str) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dk_depth, dv_depth) of one MoDA call (`moda_bwd`); the depth gradients are
    contiguous of k_depth's shape with depth_grad, else empty (0,) tensors (detached depth, L = 0)."""
    dq, dk, dv, dkd, dvd = _gradients(do, q, k, v, k_depth, v_depth, o, lse, scale, depth_grad, config)
    if dkd is None:
        dkd, dvd = q.new_empty((0,)), q.new_empty((0,))
    return dq, dk, dv, dkd, dvd


@moda_attention_bwd_op.register_fake
def _(do, q, k, v, k_depth, v_depth, o, lse, scale, depth_grad, config):
    grads = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v)]
    for t in (k_depth, v_depth):
        grads.append(torch.empty_like(t, memory_format=torch.contiguous_format) if depth_grad and t is not None
                     and t.shape[2] > 0 else q.new_empty((0,)))
    return tuple(grads)


def _setup_context(ctx, inputs, output):
    q, k, v, kd, vd, scale, depth_grad, config = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, kd, vd, o, lse)
    ctx.call = (scale, depth_grad, config)
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)  # no zero-filled tensor for lse's (or an unused out's) gradient


def _backward(ctx, do, dlse):
    """The autograd formula of both paths (looked up here at each call so tests can wrap it): the
    backward op under the op path, `_gradients` directly under the eager Function."""
    if do is None:  # only lse (not differentiable) reached the loss
        return (None,) * 8
    q, k, v, kd, vd, o, lse = ctx.saved_tensors
    scale, depth_grad, config = ctx.call
    grad_depth = kd is not None and _k.wants_depth_grad(ctx, depth_grad)
    bwd = _gradients if getattr(ctx, "eager", False) else moda_attention_bwd_op
    dq, dk, dv, dkd, dvd = bwd(do, q, k, v, kd, vd, o, lse, scale, grad_depth, config)
    return dq, dk, dv, dkd if grad_depth else None, dvd if grad_depth else None, None, None, None


moda_attention_op.register_autograd(lambda ctx, do, dlse: _backward(ctx, do, dlse), setup_context=_setup_context)


class EagerMoDA(torch.autograd.Function):
    """The eager path (`oplib.through_ops` False): the op's implementation and autograd formula in
    an autograd Function, without the dispatcher's host time. apply(q, k, v, kd, vd, scale,
    depth_grad, config key) -> (out, lse), as the op."""

    @staticmethod
    def forward(ctx, q, k, v, kd, vd, scale, depth_grad, config):
        out = _forward(q, k, v, kd, vd, scale, config)
        _setup_context(ctx, (q, k, v, kd, vd, scale, depth_grad, config), out)
        ctx.eager = True
        return out

    @staticmethod
    def backward(ctx, do, dlse):
        return _backward(ctx, do, dlse)
