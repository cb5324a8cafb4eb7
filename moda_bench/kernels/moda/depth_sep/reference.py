"""Exact dense reference of depth-sep, the seeds' variant (c) "Depth Attention": sequence attention
and a SEPARATE softmax over each position's depth entries, added (the oracle of the tests and of
the benchmark's accuracy check).

    out = softmax_seq(scale q K^T + causal) V  +  softmax_depth(scale q K_depth[t]^T) V_depth[t]

Seed 000 describes Depth Attention as its own attention read along depth (for token t, the query
attends only to the depth keys and values of the same position) beside the layer's sequence
attention; seed 001 contrasts it with MoDA's single softmax: "separate softmax normalization would
force a fixed split of attention mass between the two sources". The fixed split here is one unit
of mass each, the two normalised outputs summed (what a depth read added into the residual stream
beside the sequence attention's output gives); MoDA is the same inputs with one softmax over the
T + L keys. L = 0: plain causal attention. Computes in float64 by default; differentiable.
"""
from __future__ import annotations

import math

import torch

from moda_bench.kernels.moda.reference import moda_reference
from moda_bench.kernels.moda.validate import check_inputs

REFERENCE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def depth_softmax_reference(q, k_depth, v_depth, *, scale: float | None = None,
                            compute_dtype: torch.dtype = torch.float64):
    """The depth part alone: per (b, t, query head h), softmax over the L depth entries of KV head
    h // G at position t, weighted sum of their values. (B, T, Hq, d) in compute_dtype; zeros at L = 0."""
    B, T, Hq, d = q.shape
    L, Hk = k_depth.shape[2], k_depth.shape[3]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if L == 0:
        return torch.zeros(B, T, Hq, d, dtype=compute_dtype, device=q.device)
    q5 = q.to(compute_dtype).view(B, T, Hk, Hq // Hk, d)
    s = torch.einsum("bthgd,btlhd->bthgl", q5, k_depth.to(compute_dtype)) * scale
    p = torch.softmax(s, dim=-1)
    return torch.einsum("bthgl,btlhd->bthgd", p, v_depth.to(compute_dtype)).reshape(B, T, Hq, d)


def depth_sep_reference(q, k, v, k_depth=None, v_depth=None, *, scale: float | None = None,
                        compute_dtype: torch.dtype = torch.float64, out_dtype: torch.dtype | None = None):
    """depth-sep's out (B, T, Hq, d) in out_dtype (default q's dtype): MoDA's reference with no depth
    (causal GQA attention) plus `depth_softmax_reference`. Layouts as MoDA's: q (B,T,Hq,d), k, v
    (B,T,Hk,d), k_depth, v_depth (B,T,L,Hk,d) or None."""
    s = check_inputs(q, k, v, k_depth, v_depth, dtypes=REFERENCE_DTYPES, head_dims=None)
    out = moda_reference(q, k, v, scale=scale, compute_dtype=compute_dtype, out_dtype=compute_dtype)
    if s.L > 0:
        out = out + depth_softmax_reference(q, k_depth, v_depth, scale=scale, compute_dtype=compute_dtype)
    return out.to(out_dtype or q.dtype)
