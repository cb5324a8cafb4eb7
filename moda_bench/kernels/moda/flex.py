"""MoDA expressed with PyTorch FlexAttention (a compiled, block-sparse baseline).

One key axis of length S = T + T*L: the T sequence keys first, then the depth keys of
position 0, position 1, ... (L each, the flash-compatible layout `k_depth.view(B, T*L, Hk, d)`).
Query t may read key c iff

    c < T  and c <= t              (causal sequence keys)
    T + t*L <= c < T + (t+1)*L     (its own depth keys)

The BlockMask is built analytically per (query block, key block) tile instead of evaluating the
mask over the full T x S grid (which would not fit in memory at T = 65536). Tiles entirely
below the causal diagonal in the sequence part are "full"; every other visited tile is
"partial" (mask_mod applied inside it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

_COMPILED: dict = {}


def moda_mask_mod(T: int, L: int) -> Callable:
    """mask_mod(b, h, q_idx, kv_idx) of MoDA on the concatenated key axis (see module doc)."""

    def mask_mod(b, h, q_idx, kv_idx):
        seq = kv_idx <= q_idx  # q_idx < T, so this also forces kv_idx < T
        lo = T + q_idx * L
        return seq | ((kv_idx >= lo) & (kv_idx < lo + L))

    return mask_mod


def _tile_classes(T: int, L: int, block_q: int, block_kv: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tile booleans any (some pair allowed) and full (every pair allowed), each of shape
    (n_q_blocks, n_kv_blocks)."""
    S = T + T * L
    nq, nkv = math.ceil(T / block_q), math.ceil(S / block_kv)
    qi = torch.arange(nq, device=device, dtype=torch.int64)[:, None]
    kj = torch.arange(nkv, device=device, dtype=torch.int64)[None, :]
    qa, qb = qi * block_q, torch.clamp((qi + 1) * block_q, max=T) - 1
    ka, kb = kj * block_kv, torch.clamp((kj + 1) * block_kv, max=S) - 1
    seq_any = (ka < T) & (ka <= qb)
    # a ragged edge tile is never full (out-of-range entries count as masked, as in create_block_mask)
    seq_full = (kb < T) & (kb <= qa) & ((qi + 1) * block_q <= T)
    if L > 0:
        dep_lo = (torch.clamp(ka, min=T) - T) // L  # first position whose depth keys the block holds
        dep_hi = (kb - T) // L
        dep_any = (kb >= T) & (dep_lo <= qb) & (dep_hi >= qa)
        any_ = seq_any | dep_any
    else:
        any_ = seq_any
    return any_, seq_full


def moda_block_mask(T: int, L: int, *, device, block_size: int = 128):
    """BlockMask of MoDA over Q_LEN = T, KV_LEN = T + T*L (shared by every batch and head)."""
    from torch.nn.attention.flex_attention import BlockMask

    any_, full = _tile_classes(T, L, block_size, block_size, device)
    partial = any_ & ~full

    def ordered(sel: torch.Tensor):
        num = sel.sum(-1).to(torch.int32)[None, None]
        idx = torch.argsort(sel.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)[None, None]
        return num, idx

    kv_num, kv_idx = ordered(partial)
    full_num, full_idx = ordered(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block_size,
                                    mask_mod=moda_mask_mod(T, L), seq_lengths=(T, T + T * L))


def block_mask_depth_utilization(T: int, L: int, block_size: int = 128) -> float:
    """Useful depth logits / depth logits inside the tiles the block mask visits (per head).

    Flex evaluates every visited tile whole (mask_mod only zeroes entries), so this is the
    depth utilisation eta of the flex provider; about 1/block_size for T >> block_size.
    Query block i (rows qa..qb) visits the key blocks holding depth columns
    [T + qa*L, T + (qb+1)*L), a contiguous run of blocks, plus the block straddling the
    sequence/depth boundary when it holds one of its sequence keys (same tiles as `moda_block_mask`).
    """
    if L == 0:
        return float("nan")
    S, bs = T + T * L, block_size
    kv_start = torch.arange(math.ceil(S / bs), dtype=torch.int64) * bs
    depth_cols = torch.clamp(torch.clamp(kv_start + bs, max=S) - torch.clamp(kv_start, min=T), min=0)
    cum = torch.cat([torch.zeros(1, dtype=torch.int64), depth_cols.cumsum(0)])
    qa = torch.arange(math.ceil(T / bs), dtype=torch.int64) * bs
    qend = torch.clamp(qa + bs, max=T)  # exclusive
    first_blk = (T + qa * L) // bs
    last_blk = (T + qend * L - 1) // bs
    cols = cum[last_blk + 1] - cum[first_blk]
    b0 = T // bs  # a block straddling the sequence/depth boundary is visited for its sequence keys too
    if T % bs:
        straddle = (b0 * bs <= qend - 1) & (first_blk > b0)
        cols = cols + straddle * depth_cols[b0]
    computed = ((qend - qa) * cols).sum().item()
    return T * L / computed


@dataclass
class MoDAFlex:
    """Callable MoDA via flex_attention for one (T, L, device): fn(q, k, v, k_depth, v_depth) -> out.

    Layouts as moda_attention: q (B,T,Hq,d); k, v (B,T,Hk,d); k_depth, v_depth (B,T,L,Hk,d)
    or None; out (B,T,Hq,d). The key concatenation happens inside the call, so autograd
    reaches all five inputs (and its copy is part of the timed work).
    """

    T: int
    L: int
    block_mask: object
    attention: Callable
    block_size: int

    def __call__(self, q, k, v, k_depth=None, v_depth=None, *, scale: float | None = None):
        B, T, Hq, d = q.shape
        if T != self.T or (k_depth is None and self.L) or (k_depth is not None and k_depth.shape[2] != self.L):
            raise ValueError(f"MoDAFlex built for T={self.T}, L={self.L}; got q {tuple(q.shape)}, "
                             f"k_depth {None if k_depth is None else tuple(k_depth.shape)}")
        Hk = k.shape[2]
        if self.L:
            k = torch.cat([k, k_depth.reshape(B, T * self.L, Hk, d)], dim=1)
            v = torch.cat([v, v_depth.reshape(B, T * self.L, Hk, d)], dim=1)
        out = self.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=self.block_mask,
                             scale=scale, enable_gqa=Hq != Hk)
        return out.transpose(1, 2)


def compiled_flex_attention() -> Callable:
    """torch.compile'd flex_attention (one per process; recompiles per shape as needed)."""
    if "flex" not in _COMPILED:
        import torch._dynamo
        from torch.nn.attention.flex_attention import flex_attention

        # a sweep compiles one graph per shape: past dynamo's default limit (8) it would fall
        # back to eager flex, which materialises the T x S scores
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 256))
        _COMPILED["flex"] = torch.compile(flex_attention, dynamic=False)
    return _COMPILED["flex"]


def make_moda_flex(T: int, L: int, *, device, block_size: int = 128, compile: bool = True) -> MoDAFlex:
    """Build the block mask once and return the MoDA flex callable (compile=False: eager flex)."""
    from torch.nn.attention.flex_attention import flex_attention
    attention = compiled_flex_attention() if compile else flex_attention
    return MoDAFlex(T=T, L=L, block_mask=moda_block_mask(T, L, device=device, block_size=block_size),
                    attention=attention, block_size=block_size)
