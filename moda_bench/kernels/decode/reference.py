"""Exact dense reference of the MoDA decode operator (the oracle of the tests and of the
benchmark's accuracy check).

For each sequence b it gathers the n_b cache positions (through the block table when paged),
materialises the (Tq, n_b + L) scores of every query head with the explicit mask (new token i
sees cache positions 0 .. n_b - Tq + i and its own L depth entries) and takes one softmax, in
float64 by default.
"""
from __future__ import annotations

import math

import torch

from moda_bench.kernels.decode.validate import check_decode_inputs


def _gather(cache: torch.Tensor, b: int, n: int, block_table: torch.Tensor | None) -> torch.Tensor:
    """The first n logical positions of sequence b: (n, Hk, d)."""
    if block_table is None:
        return cache[b, :n]
    page_size = cache.shape[1]
    t = torch.arange(n, device=cache.device)
    pages = block_table[b].to(cache.device).long()[t // page_size]
    return cache[pages, t % page_size]


def decode_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_depth: torch.Tensor | None = None,
    v_depth: torch.Tensor | None = None,
    *,
    cache_seqlens: torch.Tensor | None = None,
    scale: float | None = None,
    block_table: torch.Tensor | None = None,
    num_splits: int | None = None,
    out_dtype: torch.dtype | None = None,
    compute_dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """MoDA decode by materialising each sequence's scores (same arguments as `moda_decode`;
    num_splits is accepted and ignored). Returns (B, Tq, Hq, d) in out_dtype (default q's dtype;
    torch.float64 keeps the exact values). Always checks the values of cache_seqlens and
    block_table (one host copy)."""
    del num_splits
    s = check_decode_inputs(q, k_cache, v_cache, k_depth, v_depth, cache_seqlens, block_table,
                            dtypes=(torch.float16, torch.bfloat16, torch.float32, torch.float64), head_dims=None,
                            check_values=True)
    scale = 1.0 / math.sqrt(s.d) if scale is None else float(scale)
    lens = [s.Tk] * s.B if cache_seqlens is None else [int(n) for n in cache_seqlens.cpu()]
    out = torch.empty(s.B, s.Tq, s.Hq, s.d, dtype=compute_dtype, device=q.device)
    for b, n in enumerate(lens):
        # query heads grouped by KV head: (Hk, G, Tq, d); keys (Hk, n, d), never repeated G times
        qb = q[b].to(compute_dtype).reshape(s.Tq, s.Hk, s.G, s.d).permute(1, 2, 0, 3)
        kb = _gather(k_cache, b, n, block_table).to(compute_dtype).transpose(0, 1)
        vb = _gather(v_cache, b, n, block_table).to(compute_dtype).transpose(0, 1)
        scores = torch.einsum("hgtd,hnd->hgtn", qb, kb) * scale
        last = n - s.Tq + torch.arange(s.Tq, device=q.device)  # last position new token i sees
        visible = torch.arange(n, device=q.device)[None, :] <= last[:, None]  # Tq, n
        scores = scores.masked_fill(~visible, float("-inf"))
        if s.L:
            kd = k_depth[b].to(compute_dtype).permute(2, 0, 1, 3)  # Hk, Tq, L, d
            vd = v_depth[b].to(compute_dtype).permute(2, 0, 1, 3)
            scores = torch.cat([scores, torch.einsum("hgtd,htld->hgtl", qb, kd) * scale], dim=-1)
        p = torch.softmax(scores, dim=-1)
        o = torch.einsum("hgtn,hnd->hgtd", p[..., :n], vb)
        if s.L:
            o = o + torch.einsum("hgtl,htld->hgtd", p[..., n:], vd)
        out[b] = o.permute(2, 0, 1, 3).reshape(s.Tq, s.Hq, s.d)
    return out.to(out_dtype or q.dtype)
