"""Depth-Attention as ONE autograd node whose backward chains the sequence attention's backward
into the fused mix's (`DepthAttentionChained`, `chained_depth_attention`).

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

import torch

from moda_bench.kernels.dattn.mix_triton import mix_bwd, mix_fwd, unit_last_stride
from moda_bench.kernels.dattn.validate import DAttnShape, check_dattn_inputs
from moda_bench.kernels.moda.fa4.merge import check_backend_dtype


class DepthAttentionChained(torch.autograd.Function):
    """apply(q, k, v, k_src, v_src, mix_scale, attn_scale, shape, backend) -> (out, v_mixed).
    Inputs with a unit last stride, S >= 1 (S = 0 is plain attention: not this node)."""

    @staticmethod
    def forward(ctx, q, k, v, k_src, v_src, mix_scale, attn_scale, shape, backend):
        vm, mix_lse = mix_fwd(q, k, v, k_src, v_src, mix_scale, shape)
        out, lse = backend.fwd(q, k, vm, attn_scale)
        ctx.save_for_backward(q, k, v, k_src, v_src, mix_lse, vm, out, lse)
        ctx.mix_scale, ctx.attn_scale, ctx.shape, ctx.backend = mix_scale, attn_scale, shape, backend
        return out, vm

    @staticmethod
    def backward(ctx, dout, dvm_ext):
        q, k, v, k_src, v_src, mix_lse, vm, out, lse = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        dq, dk, dvm = ctx.backend.bwd(q, k, vm, out, dout.contiguous(), lse, ctx.attn_scale)
        if dvm_ext is not None:
            dvm = dvm + dvm_ext
        dq, dk = unit_last_stride(dq), unit_last_stride(dk)
        dq, dk, dv, dks, dvs = mix_bwd(dvm, q, k, v, k_src, v_src, mix_lse, ctx.mix_scale, ctx.shape,
                                       dq_into=dq, dk_into=dk)
        return dq, dk, dv, dks, dvs, None, None, None, None


def chained_depth_attention(q, k, v, k_src, v_src, backend, *, scale: float | None = None,
                            shape: DAttnShape | None = None):
    """(out, v_mixed) of Depth-Attention with the fused Triton mix and `backend` (a
    `SequenceBackend`) for the causal attention (scale 1/sqrt(d)), as one autograd node (module
    docstring). scale: the depth softmax's (default 1/sqrt(d)). k_src, v_src (B,T,S,Hk,d) with
    S >= 1 (ValueError otherwise: S = 0 needs no mix). Gradients flow to all five inputs."""
    shape = shape or check_dattn_inputs(q, k, v, k_src, v_src, need_cuda=True)
    if shape.S == 0:
        raise ValueError("chained_depth_attention needs S >= 1 source layers (S = 0 is plain attention)")
    check_backend_dtype(q, backend, "chained_depth_attention")
    mix_scale = 1.0 / math.sqrt(shape.d) if scale is None else float(scale)
    q, k, v, k_src, v_src = (t.contiguous() for t in (q, k, v, k_src, v_src))
    return DepthAttentionChained.apply(q, k, v, k_src, v_src, mix_scale, 1.0 / math.sqrt(shape.d), shape, backend)
