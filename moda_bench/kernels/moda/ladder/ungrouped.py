"""Rungs 2-3 of the ablation ladder: one fused Triton MoDA kernel with heads NOT folded.

Each forward program owns C query positions of ONE query head (b, h) and reads KV head
h // G directly (no repeat copies). Sequence and depth logits share one online softmax.
A constexpr switch sets the depth span (spec section 3):

  span 'all'   (flash-compatible): the depth cache is one flat axis of T*L columns
               (`k_depth.view(B, T*L, Hk, d)`), every query block scans all of it and masks
               column c to its position c // L.                        eta = 1/T
  span 'chunk' (chunk-aware): a block of C positions scans only the C*L flat columns of the
               positions it covers, with the same mask.                  eta = 1/C

Backward (no atomics, deterministic), after delta = rowsum(dO * O) in PyTorch:
  1. q-major pass, grid (T/C, B*Hq): dq from the sequence keys and the depth span (same span
     as the forward).
  2. kv-major pass, grid (T/BN, B*Hk): dk, dv of a sequence-key block; loops over the G query
     heads of the KV head and over the causal query blocks.
  3. depth-major pass, grid (T*L/BD, B*Hk): dk_depth, dv_depth of a block of flat depth
     columns; loops over the G query heads and over the query rows of its span: all T rows
     for 'all' (the mirror image of the forward's full scan, again eta = 1/T) or the C rows
     of the chunk that owns the columns for 'chunk' (eta = 1/C).
Depth gradients therefore need no cross-program accumulation: every column block is owned
by exactly one program.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from moda_bench.kernels.launch import cdiv
from moda_bench.kernels.moda.triton.utils import dot_precision, mm
from moda_bench.kernels.moda.validate import check_inputs

LOG2E = 1.4426950408889634
SPANS = ("all", "chunk")


@triton.jit
def _depth_span(KD, VD, b, j, s_db, s_dh, pid_m, seq_hi, T, L, BLOCK_M: tl.constexpr, SPAN_ALL: tl.constexpr):
    """The flat depth columns [lo, hi) of KV head j that query block pid_m scans: all T*L of them
    (flash-compatible) or only those of its own positions pid_m*BLOCK_M .. seq_hi-1
    (chunk-aware). Returns (kd_base, vd_base, lo, hi, n_cols = T*L)."""
    n_cols = T * L
    if SPAN_ALL:
        lo = 0
        hi = n_cols
    else:
        lo = pid_m * BLOCK_M * L
        hi = seq_hi * L
    return KD + b * s_db + j * s_dh, VD + b * s_db + j * s_dh, lo, hi, n_cols


@triton.jit
def _query_rows(T, G, HQ, BLOCK_M: tl.constexpr, HEAD_D: tl.constexpr):
    """This program's block of query positions: (pid_m, pid_bh, b, query head h, its KV head j,
    offs_m, offs_d, row_ok) for grid (T/BLOCK_M, B*HQ)."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // HQ).to(tl.int64)
    h = pid_bh % HQ
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    return pid_m, pid_bh, b, h, h // G, offs_m, tl.arange(0, HEAD_D), offs_m < T


@triton.jit
def _kv_tiles(k_base, v_base, start, n_keys, stride, offs_d, offs_m, L, OWN: tl.constexpr, BLOCK: tl.constexpr):
    """Keys start .. start+BLOCK-1 (row stride `stride`, rows at or past n_keys read as zeros),
    their values, and which (query row, key) scores count: (k, v, ok). Sequence keys count up to
    the row's position (causal); with OWN, flat depth columns c count for position c // L."""
    offs = start + tl.arange(0, BLOCK)
    col_ok = offs < n_keys
    if OWN:
        ok = ((offs // L)[None, :] == offs_m[:, None]) & col_ok[None, :]
    else:
        ok = (offs[None, :] <= offs_m[:, None]) & col_ok[None, :]
    return (tl.load(k_base + offs[:, None] * stride + offs_d[None, :], mask=col_ok[:, None], other=0.0),
            tl.load(v_base + offs[:, None] * stride + offs_d[None, :], mask=col_ok[:, None], other=0.0), ok)


@triton.jit
def _softmax_tile(q, k, v, ok, acc, m_i, l_i, qk_scale, PREC: tl.constexpr):
    """Fold one tile of keys k, values v (scores masked to ok) into the online softmax state."""
    s = mm(q, tl.trans(k), PREC) * qk_scale
    s = tl.where(ok, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + mm(p.to(v.dtype), v, PREC)
    return acc, m_new, l_i


@triton.jit
def _dq_tile(q, do, lse, delta, k, v, ok, qk_scale, PREC: tl.constexpr):
    """The (unscaled) dq contribution of one tile of keys k, values v (scores masked to ok)."""
    s = mm(q, tl.trans(k), PREC) * qk_scale
    p = tl.where(ok, tl.exp2(s - lse[:, None]), 0.0)
    dp = mm(do, tl.trans(v), PREC)
    ds = p * (dp - delta[:, None])
    return mm(ds.to(k.dtype), k, PREC)


@triton.jit
def _fwd_kernel(
    Q, K, V, KD, VD, O, LSE,
    s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_db, s_dc, s_dh, s_ob, s_ot, s_oh,
    T, L, G, HQ, qk_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr, HEAD_D: tl.constexpr,
    HAS_DEPTH: tl.constexpr, SPAN_ALL: tl.constexpr, PREC: tl.constexpr,
):
    """O (B,T,HQ,D) and LSE (B,HQ,T, log2 domain) for BLOCK_M positions of one query head."""
    pid_m, pid_bh, b, h, j, offs_m, offs_d, row_ok = _query_rows(T, G, HQ, BLOCK_M, HEAD_D)
    q = tl.load(Q + b * s_qb + offs_m[:, None] * s_qt + h * s_qh + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    k_base = K + b * s_kb + j * s_kh
    v_base = V + b * s_kb + j * s_kh

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_D], tl.float32)

    # sequence phase: causal keys 0 .. last row of the block (key 0 keeps every row's max finite)
    seq_hi = tl.minimum((pid_m + 1) * BLOCK_M, T)
    for start_n in range(0, seq_hi, BLOCK_N):
        k, v, ok = _kv_tiles(k_base, v_base, start_n, T, s_kt, offs_d, offs_m, L, False, BLOCK_N)
        acc, m_i, l_i = _softmax_tile(q, k, v, ok, acc, m_i, l_i, qk_scale, PREC)

    # depth phase: flat depth columns c = t * L + l of the span, masked to c // L == row position
    if HAS_DEPTH:
        kd_base, vd_base, dep_lo, dep_hi, n_cols = _depth_span(KD, VD, b, j, s_db, s_dh, pid_m, seq_hi, T, L,
                                                               BLOCK_M, SPAN_ALL)
        for start_c in range(dep_lo, dep_hi, BLOCK_L):
            kd, vd, own = _kv_tiles(kd_base, vd_base, start_c, n_cols, s_dc, offs_d, offs_m, L, True, BLOCK_L)
            acc, m_i, l_i = _softmax_tile(q, kd, vd, own, acc, m_i, l_i, qk_scale, PREC)

    out = acc / l_i[:, None]
    tl.store(O + b * s_ob + offs_m[:, None] * s_ot + h * s_oh + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=row_ok[:, None])
    tl.store(LSE + pid_bh.to(tl.int64) * T + offs_m, m_i + tl.log2(l_i), mask=row_ok)


@triton.jit
def _bwd_dq_kernel(
    Q, K, V, KD, VD, DO, LSE, DELTA, DQ,
    s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_db, s_dc, s_dh,
    T, L, G, HQ, qk_scale, sm_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr, HEAD_D: tl.constexpr,
    HAS_DEPTH: tl.constexpr, SPAN_ALL: tl.constexpr, PREC: tl.constexpr,
):
    """dQ for BLOCK_M positions of one query head (q, dO, dQ share the (B,T,HQ,D) strides)."""
    pid_m, pid_bh, b, h, j, offs_m, offs_d, row_ok = _query_rows(T, G, HQ, BLOCK_M, HEAD_D)
    q_off = b * s_qb + offs_m[:, None] * s_qt + h * s_qh + offs_d[None, :]
    q = tl.load(Q + q_off, mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + q_off, mask=row_ok[:, None], other=0.0)
    lse = tl.load(LSE + pid_bh.to(tl.int64) * T + offs_m, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + pid_bh.to(tl.int64) * T + offs_m, mask=row_ok, other=0.0)
    k_base = K + b * s_kb + j * s_kh
    v_base = V + b * s_kb + j * s_kh
    dq = tl.zeros([BLOCK_M, HEAD_D], tl.float32)

    seq_hi = tl.minimum((pid_m + 1) * BLOCK_M, T)
    for start_n in range(0, seq_hi, BLOCK_N):
        k, v, ok = _kv_tiles(k_base, v_base, start_n, T, s_kt, offs_d, offs_m, L, False, BLOCK_N)
        dq += _dq_tile(q, do, lse, delta, k, v, ok & row_ok[:, None], qk_scale, PREC)

    if HAS_DEPTH:
        kd_base, vd_base, dep_lo, dep_hi, n_cols = _depth_span(KD, VD, b, j, s_db, s_dh, pid_m, seq_hi, T, L,
                                                               BLOCK_M, SPAN_ALL)
        for start_c in range(dep_lo, dep_hi, BLOCK_L):
            kd, vd, own = _kv_tiles(kd_base, vd_base, start_c, n_cols, s_dc, offs_d, offs_m, L, True, BLOCK_L)
            dq += _dq_tile(q, do, lse, delta, kd, vd, own & row_ok[:, None], qk_scale, PREC)

    tl.store(DQ + q_off, (dq * sm_scale).to(DQ.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _key_tile(K, V, n_keys, s_b, s_t, s_h, HK, BLOCK: tl.constexpr, HEAD_D: tl.constexpr):
    """This program's tile of BLOCK keys (sequence keys, or flat depth columns) of one KV head,
    grid (n_keys/BLOCK, B*HK): (pid, b, KV head j, offs, col_ok, element offsets, k, v); dK, dV
    share those offsets."""
    pid = tl.program_id(0)
    pid_bj = tl.program_id(1)
    b = (pid_bj // HK).to(tl.int64)
    j = pid_bj % HK
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    col_ok = offs < n_keys
    off = b * s_b + offs[:, None] * s_t + j * s_h + tl.arange(0, HEAD_D)[None, :]
    return (pid, b, j, offs, col_ok, off, tl.load(K + off, mask=col_ok[:, None], other=0.0),
            tl.load(V + off, mask=col_ok[:, None], other=0.0))


@triton.jit
def _kv_grads(k, v, key_pos, col_ok, dk, dv, Q, DO, LSE, DELTA, b, j, q_lo, q_hi, s_qb, s_qt, s_qh,
              T, G, HQ, qk_scale, BLOCK_M: tl.constexpr, HEAD_D: tl.constexpr, OWN: tl.constexpr,
              PREC: tl.constexpr):
    """Add to (dk (unscaled), dv) of a tile of keys k, values v at positions key_pos what the G
    query heads of KV head j contribute from query rows q_lo..q_hi: every row sees the keys at
    or before its position (sequence keys) or, with OWN, those of its own position (depth)."""
    offs_d = tl.arange(0, HEAD_D)
    for g in range(0, G):
        h = j * G + g
        row_base = (b * HQ + h) * T
        for start_m in range(q_lo, q_hi, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            row_ok = offs_m < T
            q_off = b * s_qb + offs_m[:, None] * s_qt + h * s_qh + offs_d[None, :]
            q = tl.load(Q + q_off, mask=row_ok[:, None], other=0.0)
            do = tl.load(DO + q_off, mask=row_ok[:, None], other=0.0)
            lse = tl.load(LSE + row_base + offs_m, mask=row_ok, other=0.0)
            delta = tl.load(DELTA + row_base + offs_m, mask=row_ok, other=0.0)
            s_t = mm(k, tl.trans(q), PREC) * qk_scale  # (keys, BLOCK_M)
            if OWN:
                seen = key_pos[:, None] == offs_m[None, :]
            else:
                seen = offs_m[None, :] >= key_pos[:, None]
            ok = seen & row_ok[None, :] & col_ok[:, None]
            p_t = tl.where(ok, tl.exp2(s_t - lse[None, :]), 0.0)
            dv += mm(p_t.to(do.dtype), do, PREC)
            dp_t = mm(v, tl.trans(do), PREC)
            ds_t = p_t * (dp_t - delta[None, :])
            dk += mm(ds_t.to(q.dtype), q, PREC)
    return dk, dv


@triton.jit
def _bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV,
    s_qb, s_qt, s_qh, s_kb, s_kt, s_kh,
    T, G, HQ, HK, qk_scale, sm_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr, PREC: tl.constexpr,
):
    """dK, dV of BLOCK_N sequence keys of one KV head, summed over its G query heads
    (k, v, dK, dV share the (B,T,HK,D) strides)."""
    pid_n, b, j, offs_n, col_ok, kv_off, k, v = _key_tile(K, V, T, s_kb, s_kt, s_kh, HK, BLOCK_N, HEAD_D)
    dk = tl.zeros([BLOCK_N, HEAD_D], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_D], tl.float32)
    q_lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M
    dk, dv = _kv_grads(k, v, offs_n, col_ok, dk, dv, Q, DO, LSE, DELTA, b, j, q_lo, T, s_qb, s_qt, s_qh,
                       T, G, HQ, qk_scale, BLOCK_M, HEAD_D, False, PREC)
    tl.store(DK + kv_off, (dk * sm_scale).to(DK.dtype.element_ty), mask=col_ok[:, None])
    tl.store(DV + kv_off, dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


@triton.jit
def _bwd_depth_kernel(
    Q, KD, VD, DO, LSE, DELTA, DKD, DVD,
    s_qb, s_qt, s_qh, s_db, s_dc, s_dh,
    T, L, G, HQ, HK, qk_scale, sm_scale,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_D: tl.constexpr,
    SPAN_ALL: tl.constexpr, PREC: tl.constexpr,
):
    """dK_depth, dV_depth of BLOCK_D flat depth columns of one KV head, summed over its G query
    heads; query rows scanned: all T ('all') or the BLOCK_M-row chunk owning the columns
    ('chunk', requires BLOCK_D | BLOCK_M * L). kd, vd, dKd, dVd share the flat strides."""
    pid_c, b, j, offs_c, col_ok, d_off, kd, vd = _key_tile(KD, VD, T * L, s_db, s_dc, s_dh, HK, BLOCK_D, HEAD_D)
    dkd = tl.zeros([BLOCK_D, HEAD_D], tl.float32)
    dvd = tl.zeros([BLOCK_D, HEAD_D], tl.float32)
    if SPAN_ALL:
        q_lo = 0
        q_hi = T
    else:
        q_lo = ((pid_c * BLOCK_D) // (BLOCK_M * L)) * BLOCK_M
        q_hi = tl.minimum(q_lo + BLOCK_M, T)
    dkd, dvd = _kv_grads(kd, vd, offs_c // L, col_ok, dkd, dvd, Q, DO, LSE, DELTA, b, j, q_lo, q_hi, s_qb, s_qt,
                         s_qh, T, G, HQ, qk_scale, BLOCK_M, HEAD_D, True, PREC)
    tl.store(DKD + d_off, (dkd * sm_scale).to(DKD.dtype.element_ty), mask=col_ok[:, None])
    tl.store(DVD + d_off, dvd.to(DVD.dtype.element_ty), mask=col_ok[:, None])


def tiles(chunk: int, d: int) -> dict:
    """Block sizes and launch options: BLOCK_M = C rows; key/depth steps of min(C, 64)."""
    step = min(chunk, 64)
    warps = 4 if chunk * d <= 64 * 64 else 8
    return {"BLOCK_M": chunk, "BLOCK_N": step, "BLOCK_L": step, "num_warps": warps, "num_stages": 2}


def _flat_depth(t: torch.Tensor) -> torch.Tensor:
    """(B, T, L, Hk, d) -> (B, T*L, Hk, d): the flat depth axis (free for contiguous input)."""
    B, T, L, Hk, d = t.shape
    return t.reshape(B, T * L, Hk, d)


class _UngroupedMoDA(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, k_depth, v_depth, sm_scale: float, chunk: int, span_all: bool):
        B, T, Hq, d = q.shape
        Hk = k.shape[2]
        L = 0 if k_depth is None else k_depth.shape[2]
        has_depth = L > 0
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        kd = _flat_depth(k_depth.contiguous()) if has_depth else k  # dummy pointer when L == 0
        vd = _flat_depth(v_depth.contiguous()) if has_depth else v
        o = torch.empty_like(q)
        lse = torch.empty(B, Hq, T, device=q.device, dtype=torch.float32)
        prec = dot_precision(q.dtype)
        tile = tiles(chunk, d)
        grid = (cdiv(T, chunk), B * Hq)
        _fwd_kernel[grid](
            q, k, v, kd, vd, o, lse,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            kd.stride(0), kd.stride(1), kd.stride(2), o.stride(0), o.stride(1), o.stride(2),
            T, max(L, 1), Hq // Hk, Hq, sm_scale * LOG2E,
            HEAD_D=d, HAS_DEPTH=has_depth, SPAN_ALL=span_all, PREC=prec, **tile,
        )
        ctx.save_for_backward(q, k, v, kd, vd, o, lse)
        ctx.meta = (sm_scale, chunk, span_all, L, k_depth is not None)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, kd, vd, o, lse = ctx.saved_tensors
        sm_scale, chunk, span_all, L, depth_given = ctx.meta
        B, T, Hq, d = q.shape
        Hk = k.shape[2]
        G = Hq // Hk
        has_depth = L > 0
        do = do.contiguous()
        delta = (do.float() * o.float()).sum(-1).permute(0, 2, 1).contiguous()  # (B, Hq, T)
        prec = dot_precision(q.dtype)
        tile = tiles(chunk, d)
        qk_scale = sm_scale * LOG2E
        dq = torch.empty_like(q)
        _bwd_dq_kernel[(cdiv(T, chunk), B * Hq)](
            q, k, v, kd, vd, do, lse, delta, dq,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            kd.stride(0), kd.stride(1), kd.stride(2),
            T, max(L, 1), G, Hq, qk_scale, sm_scale,
            HEAD_D=d, HAS_DEPTH=has_depth, SPAN_ALL=span_all, PREC=prec, **tile,
        )
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        _bwd_dkdv_kernel[(cdiv(T, tile["BLOCK_N"]), B * Hk)](
            q, k, v, do, lse, delta, dk, dv,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            T, G, Hq, Hk, qk_scale, sm_scale,
            BLOCK_M=chunk, BLOCK_N=tile["BLOCK_N"], HEAD_D=d, PREC=prec,
            num_warps=tile["num_warps"], num_stages=tile["num_stages"],
        )
        dkd = dvd = None
        if has_depth:
            dkd, dvd = torch.empty_like(kd), torch.empty_like(vd)
            _bwd_depth_kernel[(cdiv(T * L, tile["BLOCK_L"]), B * Hk)](
                q, kd, vd, do, lse, delta, dkd, dvd,
                q.stride(0), q.stride(1), q.stride(2), kd.stride(0), kd.stride(1), kd.stride(2),
                T, L, G, Hq, Hk, qk_scale, sm_scale,
                BLOCK_M=chunk, BLOCK_D=tile["BLOCK_L"], HEAD_D=d, SPAN_ALL=span_all, PREC=prec,
                num_warps=tile["num_warps"], num_stages=tile["num_stages"],
            )
            dkd, dvd = dkd.view(B, T, L, Hk, d), dvd.view(B, T, L, Hk, d)
        elif depth_given:  # L == 0 depth tensors: empty gradients
            dkd = torch.zeros(B, T, 0, Hk, d, device=q.device, dtype=q.dtype)
            dvd = torch.zeros_like(dkd)
        return dq, dk, dv, dkd, dvd, None, None, None


def check_chunk(chunk: int) -> int:
    """The query chunk C: a power of two in 16..128 (Triton dots need >= 16 rows)."""
    if not isinstance(chunk, int) or chunk < 16 or chunk > 128 or chunk & (chunk - 1):
        raise ValueError(f"chunk must be a power of two in 16..128, got {chunk!r}")
    return chunk


def moda_ungrouped(q, k, v, k_depth=None, v_depth=None, *, scale: float | None = None, chunk: int = 64,
                   span: str = "chunk") -> torch.Tensor:
    """MoDA with the heads-unfolded fused kernel; span 'all' (flash-compatible) or 'chunk'.

    q (B,T,Hq,d); k, v (B,T,Hk,d); k_depth, v_depth (B,T,L,Hk,d) or None -> out (B,T,Hq,d).
    Differentiable w.r.t. all five inputs.
    """
    if span not in SPANS:
        raise ValueError(f"span must be one of {SPANS}, got {span!r}")
    shape = check_inputs(q, k, v, k_depth, v_depth, need_cuda=True)
    check_chunk(chunk)
    sm_scale = 1.0 / math.sqrt(shape.d) if scale is None else float(scale)
    return _UngroupedMoDA.apply(q, k, v, k_depth, v_depth, sm_scale, chunk, span == "all")
