"""Exact dense MoDA reference: materialised scores with the joint causal + depth mask.

Used as the oracle in every test. Computes in float64 by default (`compute_dtype`), returns
`out` in q's dtype unless `out_dtype` says otherwise.
"""
from __future__ import annotations

import math

import torch

from moda_bench.kernels.moda.validate import check_inputs


def moda_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_depth: torch.Tensor | None = None,
    v_depth: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    return_lse: bool = False,
    compute_dtype: torch.dtype = torch.float64,
    out_dtype: torch.dtype | None = None,
):
    """MoDA forward by materialising the (T, T + L) score matrix per (batch, head).

    q (B,T,Hq,d); k, v (B,T,Hk,d); k_depth, v_depth (B,T,L,Hk,d) or None.
    Returns out (B,T,Hq,d) [and lse (B,T,Hq) float32]. Differentiable through autograd.
    """
    s = check_inputs(q, k, v, k_depth, v_depth, dtypes=(torch.float16, torch.bfloat16, torch.float32, torch.float64),
                     head_dims=None)
    G = s.G
    scale = 1.0 / math.sqrt(s.d) if scale is None else scale
    qc = q.to(compute_dtype).permute(0, 2, 1, 3)  # B,Hq,T,d
    kc = k.to(compute_dtype).repeat_interleave(G, dim=2).permute(0, 2, 1, 3)
    vc = v.to(compute_dtype).repeat_interleave(G, dim=2).permute(0, 2, 1, 3)
    s_seq = torch.matmul(qc, kc.transpose(-1, -2)) * scale  # B,Hq,T,T
    causal = torch.ones(s.T, s.T, dtype=torch.bool, device=q.device).tril()
    s_seq = s_seq.masked_fill(~causal, float("-inf"))
    if s.L > 0:
        kd = k_depth.to(compute_dtype).repeat_interleave(G, dim=3).permute(0, 3, 1, 2, 4)  # B,Hq,T,L,d
        vd = v_depth.to(compute_dtype).repeat_interleave(G, dim=3).permute(0, 3, 1, 2, 4)
        s_dep = torch.einsum("bhtd,bhtld->bhtl", qc, kd) * scale  # B,Hq,T,L
        scores = torch.cat([s_seq, s_dep], dim=-1)
    else:
        scores = s_seq
    lse = torch.logsumexp(scores, dim=-1)  # B,Hq,T
    p = torch.exp(scores - lse[..., None])
    out = torch.matmul(p[..., : s.T], vc)
    if s.L > 0:
        out = out + torch.einsum("bhtl,bhtld->bhtd", p[..., s.T:], vd)
    out = out.permute(0, 2, 1, 3).to(out_dtype or q.dtype)
    if return_lse:
        return out, lse.permute(0, 2, 1).float()
    return out


def depth_backward_reference(q, do, o, lse, k_depth, v_depth, scale: float):
    """The depth keys' part of MoDA's backward in float64, given the whole softmax's out and lse
    (B,T,Hq), as `kernel_depth.depth_bwd` and `depth_bwd_sm90` compute it: (dq share (B,T,Hq,d),
    dk_depth, dv_depth (B,T,L,Hk,d)). Each row's delta = rowsum(o * do)."""
    B, T, Hq, d = q.shape
    Hk = k_depth.shape[3]
    G = Hq // Hk
    q4, do4, o4 = (x.double().view(B, T, Hk, G, d) for x in (q, do, o))
    kd, vd = k_depth.double(), v_depth.double()
    p = torch.exp(torch.einsum("bthgd,btlhd->bthgl", q4, kd) * scale - lse.double().view(B, T, Hk, G, 1))
    ds = p * (torch.einsum("bthgd,btlhd->bthgl", do4, vd) - (o4 * do4).sum(-1, keepdim=True))
    return (torch.einsum("bthgl,btlhd->bthgd", ds, kd).reshape(B, T, Hq, d) * scale,
            torch.einsum("bthgl,bthgd->btlhd", ds, q4) * scale, torch.einsum("bthgl,bthgd->btlhd", p, do4))
