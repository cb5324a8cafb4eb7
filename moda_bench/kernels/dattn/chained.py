"""Depth-Attention as ONE autograd node whose backward chains the sequence attention's backward
into the fused mix's: the torch custom op `moda_bench::depth_attention` (`depth_attention_op`, its
autograd through `moda_bench::depth_attention_bwd`; the backend passed by name) under
torch.compile, the autograd Function `EagerChained` over the same implementation in eager
(`oplib.through_ops`), and `chained_depth_attention`.

Composed through autograd (`depth_attention` with a plain attention callable), q and k each get
two gradient contributions (the sequence attention's and the mix's) that autograd sums in extra
kernels: the mix writes a q-sized dq share, then a sum reads both and writes a third. Here the
backward runs the sequence backend's raw backward first (dq, dk, dv_mixed), then the mix's
backward kernel with `dq_into` / `dk_into`, which reads the sequence dq and dk, adds its shares in
fp32 and writes them back once. The sequence half is a `moda_bench.kernels.moda.fa4.merge.SequenceBackend`
(FA4's `_flash_attn_fwd` / `_flash_attn_bwd`; the plain-torch one in tests).

The node returns (out, v_mixed); a gradient arriving at v_mixed from later layers (it is their
v_src) is added to the sequence attention's dv_mixed before the mix's backward.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from moda_bench.kernels.dattn.mix_triton import mix_bwd, mix_fwd, unit_last_stride
from moda_bench.kernels.dattn.validate import DAttnShape, check_dattn_inputs
from moda_bench.kernels.moda.fa4.merge import check_backend_dtype
from moda_bench.kernels.oplib import backend_key, backend_of, through_ops


@torch.library.custom_op("moda_bench::depth_attention", mutates_args=())
def depth_attention_op(q: Tensor, k: Tensor, v: Tensor, k_src: Tensor, v_src: Tensor, mix_scale: float,
                       attn_scale: float, backend: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(out, v_mixed, the mix's lse (B*T*Hk,), the attention's lse (B,Hq,T)) of the chained node:
    the fused mix, then the named `SequenceBackend`'s raw forward (`oplib.backend_of`). q, k, v
    contiguous; the sources with a unit last stride (read in place)."""
    return _forward(q, k, v, k_src, v_src, mix_scale, attn_scale, backend)


def _forward(q, k, v, k_src, v_src, mix_scale, attn_scale, backend):
    shape = check_dattn_inputs(q, k, v, k_src, v_src, need_cuda=True)
    q, k, v = (t.contiguous() for t in (q, k, v))
    k_src, v_src = unit_last_stride(k_src), unit_last_stride(v_src)
    vm, mix_lse = mix_fwd(q, k, v, k_src, v_src, mix_scale, shape)
    out, lse = backend_of(backend).fwd(q, k, vm, attn_scale)
    return out, vm, mix_lse, lse


@depth_attention_op.register_fake
def _(q, k, v, k_src, v_src, mix_scale, attn_scale, backend):
    B, T, Hq, d = q.shape
    return (torch.empty_like(q, memory_format=torch.contiguous_format), torch.empty(v.shape, device=v.device,
                                                                                     dtype=v.dtype),
            q.new_empty((B * T * k.shape[2],), dtype=torch.float32), q.new_empty((B, Hq, T), dtype=torch.float32))


@torch.library.custom_op("moda_bench::depth_attention_bwd", mutates_args=())
def depth_attention_bwd_op(dout: Tensor, dvm_ext: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor, k_src: Tensor,
                           v_src: Tensor, mix_lse: Tensor, vm: Tensor, out: Tensor, lse: Tensor, mix_scale: float,
                           attn_scale: float, backend: str) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dk_src, dv_src): the backend's raw backward (dq, dk, dv_mixed), the gradient
    reaching v_mixed from later layers (dvm_ext) added, then the mix's backward adding its dq/dk
    shares into the backend's dq and dk (module docstring)."""
    return _gradients(dout, dvm_ext, q, k, v, k_src, v_src, mix_lse, vm, out, lse, mix_scale, attn_scale, backend)


def _gradients(dout, dvm_ext, q, k, v, k_src, v_src, mix_lse, vm, out, lse, mix_scale, attn_scale, backend):
    shape = check_dattn_inputs(q, k, v, k_src, v_src, need_cuda=True)
    q, k, v = (t.contiguous() for t in (q, k, v))
    k_src, v_src = unit_last_stride(k_src), unit_last_stride(v_src)
    dq, dk, dvm = backend_of(backend).bwd(q, k, vm, out, dout.contiguous(), lse, attn_scale)
    if dvm_ext is not None:
        dvm = dvm + dvm_ext
    dq, dk = unit_last_stride(dq), unit_last_stride(dk)
    return mix_bwd(dvm, q, k, v, k_src, v_src, mix_lse, mix_scale, shape, dq_into=dq, dk_into=dk)


@depth_attention_bwd_op.register_fake
def _(dout, dvm_ext, q, k, v, k_src, v_src, mix_lse, vm, out, lse, mix_scale, attn_scale, backend):
    return tuple(torch.empty(t.shape, device=t.device, dtype=t.dtype) for t in (q, k, v, k_src, v_src))


def _setup(ctx, inputs, output):
    q, k, v, k_src, v_src, mix_scale, attn_scale, backend = inputs
    out, vm, mix_lse, lse = output
    ctx.save_for_backward(q, k, v, k_src, v_src, mix_lse, vm, out, lse)
    ctx.call = (mix_scale, attn_scale, backend)
    ctx.mark_non_differentiable(mix_lse, lse)
    ctx.set_materialize_grads(False)


def _backward(ctx, dout, dvm_ext, _dmix_lse, _dlse):
    q, k, v, k_src, v_src, mix_lse, vm, out, lse = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    bwd = _gradients if getattr(ctx, "eager", False) else depth_attention_bwd_op
    grads = bwd(dout, dvm_ext, q, k, v, k_src, v_src, mix_lse, vm, out, lse, *ctx.call)
    return (*grads, None, None, None)


depth_attention_op.register_autograd(_backward, setup_context=_setup)


class EagerChained(torch.autograd.Function):
    """The eager path (`oplib.through_ops`): the ops' implementations in an autograd Function.
    apply(q, k, v, k_src, v_src, mix_scale, attn_scale, backend name) -> as `depth_attention_op`."""

    @staticmethod
    def forward(ctx, q, k, v, k_src, v_src, mix_scale, attn_scale, backend):
        out = _forward(q, k, v, k_src, v_src, mix_scale, attn_scale, backend)
        _setup(ctx, (q, k, v, k_src, v_src, mix_scale, attn_scale, backend), out)
        ctx.eager = True
        return out

    @staticmethod
    def backward(ctx, *grads):
        return _backward(ctx, *grads)


def chained_depth_attention(q, k, v, k_src, v_src, backend, *, scale: float | None = None,
                            shape: DAttnShape | None = None):
    """(out, v_mixed) of Depth-Attention with the fused Triton mix and `backend` (a
    `SequenceBackend`) for the causal attention (scale 1/sqrt(d)), as one autograd node (module
    docstring). scale: the depth softmax's (default 1/sqrt(d)). k_src, v_src (B,T,S,Hk,d) with
    S >= 1 (ValueError otherwise: S = 0 needs no mix). Gradients flow to all five inputs."""
    if shape is None and not torch.compiler.is_compiling():  # eager: one-line errors (the op checks again)
        shape = check_dattn_inputs(q, k, v, k_src, v_src, need_cuda=True)
    if k_src is None or k_src.shape[2] == 0:
        raise ValueError("chained_depth_attention needs S >= 1 source layers (S = 0 is plain attention)")
    check_backend_dtype(q, backend, "chained_depth_attention")
    d = q.shape[-1]
    mix_scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    q, k, v = (t.contiguous() for t in (q, k, v))
    k_src, v_src = unit_last_stride(k_src), unit_last_stride(v_src)  # sources read in place
    call = depth_attention_op if through_ops() else EagerChained.apply
    out, vm, _, _ = call(q, k, v, k_src, v_src, mix_scale, 1.0 / math.sqrt(d), backend_key(backend))
    return out, vm
