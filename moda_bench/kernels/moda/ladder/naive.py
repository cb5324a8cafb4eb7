"""Rung 1 of the ablation ladder: MoDA as explicit PyTorch for-loops over positions.

For every position t the loop gathers the causal sequence keys k[:, :t+1] and the L depth
entries k_depth[:, t] of that position, scores them against q[:, t] with matmuls batched over
heads (the G query heads of a KV head share it through a view, no copies), takes one softmax
over both and mixes the values. Computes in float32, differentiable through autograd.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from moda_bench.kernels.moda.validate import check_inputs


def moda_naive(q, k, v, k_depth=None, v_depth=None, *, scale: float | None = None, chunk: int | None = None,
               on_step: Optional[Callable[[int], None]] = None) -> torch.Tensor:
    """q (B,T,Hq,d); k, v (B,T,Hk,d); k_depth, v_depth (B,T,L,Hk,d) or None -> out (B,T,Hq,d).

    `chunk` is accepted for a uniform rung signature and ignored; `on_step(t)` (optional) is
    called after each position, for progress display.
    """
    s = check_inputs(q, k, v, k_depth, v_depth)
    B, T, Hq, Hk, d, L, G = s.B, s.T, s.Hq, s.Hk, s.d, s.L, s.G
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    f32 = torch.float32
    qh = q.to(f32).view(B, T, Hk, G, d)                        # query heads grouped by KV head
    kh = k.to(f32).permute(0, 2, 3, 1)                          # B, Hk, d, T
    vh = v.to(f32).permute(0, 2, 1, 3)                          # B, Hk, T, d
    if L > 0:
        kdh = k_depth.to(f32).permute(0, 1, 3, 4, 2)           # B, T, Hk, d, L
        vdh = v_depth.to(f32).permute(0, 1, 3, 2, 4)           # B, T, Hk, L, d
    outs = []
    for t in range(T):
        q_t = qh[:, t]                                          # B, Hk, G, d
        logits = torch.matmul(q_t, kh[..., : t + 1])            # B, Hk, G, t+1
        if L > 0:
            logits = torch.cat([logits, torch.matmul(q_t, kdh[:, t])], dim=-1)  # + B, Hk, G, L
        p = torch.softmax(logits * scale, dim=-1)
        o_t = torch.matmul(p[..., : t + 1], vh[:, :, : t + 1])  # B, Hk, G, d
        if L > 0:
            o_t = o_t + torch.matmul(p[..., t + 1:], vdh[:, t])
        outs.append(o_t.reshape(B, Hq, d))
        if on_step is not None:
            on_step(t)
    return torch.stack(outs, dim=1).to(q.dtype)
