"""The depth mix in plain PyTorch ops, written the way a reference implementation of the
Depth-Attention paper would (the `dattn-torch` baseline the benchmark compares the fused Triton
mix against): the mean over each group's query heads, einsum scores, a float32 softmax over the
S+1 sources, a weighted sum. Autograd does the backward. No special optimisation, no deliberate
waste: scores and weighted sums run in the inputs' dtype (fp32 accumulation inside the matmuls),
only the small (B, T, Hk, S+1) score tensor is upcast, and the own entry is handled beside the
sources instead of concatenating k with k_src (which would copy every source).
"""
from __future__ import annotations

import math

import torch

from moda_bench.kernels.dattn.validate import check_dattn_inputs


def depth_mix_torch(q, k, v, k_src=None, v_src=None, scale: float | None = None):
    """v_mixed (B,T,Hk,d) in v's dtype, same contract as `mix_kernel.depth_mix` (any device,
    fp16/bf16/fp32; S = 0 returns v itself)."""
    s = check_dattn_inputs(q, k, v, k_src, v_src)
    if s.S == 0:
        return v
    scale = 1.0 / math.sqrt(s.d) if scale is None else float(scale)
    qbar = q.unflatten(2, (s.Hk, s.G)).mean(dim=3)  # B,T,Hk,d: GQA rule, one query per KV head
    own = torch.einsum("bthd,bthd->bth", qbar, k)  # B,T,Hk
    src = torch.einsum("bthd,btshd->bths", qbar, k_src)  # B,T,Hk,S
    scores = torch.cat([own.unsqueeze(-1), src], dim=-1).float() * scale
    alpha = torch.softmax(scores, dim=-1).to(v.dtype)  # B,T,Hk,S+1
    mixed = alpha[..., 0, None] * v + torch.einsum("bths,btshd->bthd", alpha[..., 1:], v_src)
    return mixed.to(v.dtype)
