"""Causal GQA sequence attention as a torch custom op, `moda_bench::sequence_attention` (its
autograd through `moda_bench::sequence_attention_bwd`), over a named
`merge.SequenceBackend` (FA4's `_flash_attn_fwd` / `_flash_attn_bwd`; the plain-torch backend in
tests).

Why: FlashAttention-4's `flash_attn_func` is a Python autograd Function whose forward builds and
launches CuTe DSL kernels; dynamo traces into it and breaks the graph. A model compiled with
`fullgraph=True` (vanilla layers with FA4 as their attention) therefore calls this op, which
dynamo treats as one opaque node with a fake implementation. Eager calls keep `flash_attn_func`
(`merge.fa4_attention`), whose host cost is lower than a Python custom op's (`oplib.through_ops`).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from moda_bench.kernels.oplib import backend_key, backend_of


@torch.library.custom_op("moda_bench::sequence_attention", mutates_args=())
def sequence_attention_op(q: Tensor, k: Tensor, v: Tensor, scale: float, backend: str) -> tuple[Tensor, Tensor]:
    """(out (B,T,Hq,d), lse (B,Hq,T) float32) of causal GQA attention by the named backend."""
    q, k, v = (t.contiguous() for t in (q, k, v))
    out, lse = backend_of(backend).fwd(q, k, v, scale)
    return out.contiguous(), lse.contiguous()


@sequence_attention_op.register_fake
def _(q, k, v, scale, backend):
    B, T, Hq, _ = q.shape
    return torch.empty(q.shape, device=q.device, dtype=q.dtype), q.new_empty((B, Hq, T), dtype=torch.float32)


@torch.library.custom_op("moda_bench::sequence_attention_bwd", mutates_args=())
def sequence_attention_bwd_op(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, scale: float,
                              backend: str) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of `sequence_attention_op` given its out and lse."""
    dq, dk, dv = backend_of(backend).bwd(q, k, v, out, dout.contiguous(), lse, scale)
    return dq.contiguous(), dk.contiguous(), dv.contiguous()


@sequence_attention_bwd_op.register_fake
def _(dout, q, k, v, out, lse, scale, backend):
    return tuple(torch.empty(t.shape, device=t.device, dtype=t.dtype) for t in (q, k, v))


def _setup(ctx, inputs, output):
    q, k, v, scale, backend = inputs
    out, lse = output
    ctx.save_for_backward(q.contiguous(), k.contiguous(), v.contiguous(), out, lse)
    ctx.call = (scale, backend)
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)


def _backward(ctx, dout, _dlse):
    if dout is None:
        return None, None, None, None, None
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = sequence_attention_bwd_op(dout, q, k, v, out, lse, *ctx.call)
    return dq, dk, dv, None, None


sequence_attention_op.register_autograd(_backward, setup_context=_setup)


def sequence_attention(q: Tensor, k: Tensor, v: Tensor, backend, *, scale: Optional[float] = None) -> Tensor:
    """Causal GQA attention out (B,T,Hq,d) of q (B,T,Hq,d), k, v (B,T,Hk,d) through the custom op with
    `backend` (a `SequenceBackend`); traceable by torch.compile with no graph break."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return sequence_attention_op(q, k, v, scale, backend_key(backend))[0]
