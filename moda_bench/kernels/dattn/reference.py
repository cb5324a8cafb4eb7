"""Exact dense Depth-Attention reference (the oracle of the tests and the benchmark's accuracy check).

Owns `mix_reference` (the depth mix alone, the Depth-Attention paper's equations 2-3 with its
GQA rule) and `depth_attention_reference` (the mix, then equation 4: dense causal GQA attention
of (q, k, v_mixed) with an explicit causal mask and explicit head repetition). Computes in
float64 by default; differentiable through autograd.

Both are per position in the mix and causal in the attention, so the reference of a prefix
(positions < n) equals the prefix of the reference: the benchmark's prefix check is exact.
"""
from __future__ import annotations

import math

import torch

from moda_bench.kernels.dattn.validate import REFERENCE_DTYPES, check_dattn_inputs


def mix_reference(q, k, v, k_src=None, v_src=None, *, scale: float | None = None,
                  compute_dtype: torch.dtype = torch.float64, out_dtype: torch.dtype | None = None):
    """v_mixed (B, T, Hk, d): for each (b, t, KV head j), qbar = the mean of the G query heads
    j*G .. j*G+G-1; alpha = softmax(scale * [<qbar, k>, <qbar, k_src[s]> for s < S]);
    v_mixed = alpha_own * v + sum_s alpha_s * v_src[s]. scale defaults to 1/sqrt(d).
    Returned in out_dtype (default v's dtype)."""
    s = check_dattn_inputs(q, k, v, k_src, v_src, dtypes=REFERENCE_DTYPES, head_dims=None)
    scale = 1.0 / math.sqrt(s.d) if scale is None else float(scale)
    qbar = q.to(compute_dtype).reshape(s.B, s.T, s.Hk, s.G, s.d).mean(dim=3)  # B,T,Hk,d
    keys = [k.to(compute_dtype)] + [k_src[:, :, i].to(compute_dtype) for i in range(s.S)]
    vals = [v.to(compute_dtype)] + [v_src[:, :, i].to(compute_dtype) for i in range(s.S)]
    logits = torch.stack([(qbar * key).sum(-1) for key in keys], dim=-1) * scale  # B,T,Hk,S+1
    alpha = torch.softmax(logits, dim=-1)
    mixed = sum(alpha[..., i, None] * val for i, val in enumerate(vals))
    return mixed.to(out_dtype or v.dtype)


def causal_gqa_reference(q, k, v, compute_dtype: torch.dtype = torch.float64):
    """Dense causal GQA attention, scale 1/sqrt(d): q (B,T,Hq,d), k, v (B,T,Hk,d); query head h
    reads KV head h // G. Returns (B,T,Hq,d) in compute_dtype."""
    B, T, Hq, d = q.shape
    G = Hq // k.shape[2]
    qc = q.to(compute_dtype).transpose(1, 2)  # B,Hq,T,d
    kc = k.to(compute_dtype).repeat_interleave(G, dim=2).transpose(1, 2)
    vc = v.to(compute_dtype).repeat_interleave(G, dim=2).transpose(1, 2)
    scores = torch.matmul(qc, kc.transpose(-1, -2)) / math.sqrt(d)
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    p = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    return torch.matmul(p, vc).transpose(1, 2)


def depth_attention_reference(q, k, v, k_src=None, v_src=None, *, scale: float | None = None,
                              return_mixed: bool = False, compute_dtype: torch.dtype = torch.float64,
                              out_dtype: torch.dtype | None = None):
    """Depth-Attention by dense materialisation: v_mixed = `mix_reference(...)` (kept in
    compute_dtype), out = causal GQA attention of (q, k, v_mixed) with the sequence scale
    1/sqrt(d) (`scale` is the depth softmax's only, as in `depth_attention`).

    Returns out (B,T,Hq,d) in out_dtype (default q's dtype), and (out, v_mixed) with
    return_mixed (v_mixed in out_dtype, default v's dtype)."""
    vm = mix_reference(q, k, v, k_src, v_src, scale=scale, compute_dtype=compute_dtype, out_dtype=compute_dtype)
    out = causal_gqa_reference(q, k, vm, compute_dtype).to(out_dtype or q.dtype)
    if return_mixed:
        return out, vm.to(out_dtype or v.dtype)
    return out
