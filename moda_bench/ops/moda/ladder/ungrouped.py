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

from moda_bench.ops.moda.triton_utils import dot_precision, mm
from moda_bench.ops.moda.validate import check_inputs

LOG2E = 1.4426950408889634
SPANS = ("all", "chunk")


@triton.jit
def _depth_span(pid_m, seq_hi, n_cols, L, BLOCK_M: tl.constexpr, SPAN_ALL: tl.constexpr):
    """Flat depth columns [lo, hi) that query block pid_m scans: all T*L of them
    (flash-compatible) or only those of its own positions pid_m*BLOCK_M .. seq_hi-1 (chunk-aware)."""
    if SPAN_ALL:
        return 0, n_cols
    else:
        return pid_m * BLOCK_M * L, seq_hi * L


@triton.jit
def _fwd_kernel(
    Q, K, V, KD, VD, O, LSE,
    s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_db, s_dc, s_dh, s_ob, s_ot, s_oh,
    T, L, G, HQ, qk_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr, HEAD_D: tl.constexpr,
    HAS_DEPTH: tl.constexpr, SPAN_ALL: tl.constexpr, PREC: tl.constexpr,
):
    """O (B,T,HQ,D) and LSE (B,HQ,T, log2 domain) for BLOCK_M positions of one query head."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // HQ).to(tl.int64)
    h = pid_bh % HQ
    j = h // G
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_D)
    row_ok = offs_m < T
    q = tl.load(Q + b * s_qb + offs_m[:, None] * s_qt + h * s_qh + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    k_base = K + b * s_kb + j * s_kh
    v_base = V + b * s_kb + j * s_kh

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_D], tl.float32)

    # sequence phase: causal keys 0 .. last row of the block (key 0 keeps every row's max finite)
    seq_hi = tl.minimum((pid_m + 1) * BLOCK_M, T)
    for start_n in range(0, seq_hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_ok = offs_n < T
        k = tl.load(k_base + offs_n[:, None] * s_kt + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        v = tl.load(v_base + offs_n[:, None] * s_kt + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        s = mm(q, tl.trans(k), PREC) * qk_scale
        s = tl.where((offs_n[None, :] <= offs_m[:, None]) & col_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + mm(p.to(v.dtype), v, PREC)
        m_i = m_new

    # depth phase: flat depth columns c = t * L + l of the span, masked to c // L == row position
    if HAS_DEPTH:
        n_cols = T * L
        dep_lo, dep_hi = _depth_span(pid_m, seq_hi, n_cols, L, BLOCK_M, SPAN_ALL)
        kd_base = KD + b * s_db + j * s_dh
        vd_base = VD + b * s_db + j * s_dh
        for start_c in range(dep_lo, dep_hi, BLOCK_L):
            offs_c = start_c + tl.arange(0, BLOCK_L)
            col_ok = offs_c < n_cols
            kd = tl.load(kd_base + offs_c[:, None] * s_dc + offs_d[None, :], mask=col_ok[:, None], other=0.0)
            vd = tl.load(vd_base + offs_c[:, None] * s_dc + offs_d[None, :], mask=col_ok[:, None], other=0.0)
            s = mm(q, tl.trans(kd), PREC) * qk_scale
            s = tl.where(((offs_c // L)[None, :] == offs_m[:, None]) & col_ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + mm(p.to(vd.dtype), vd, PREC)
            m_i = m_new

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
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // HQ).to(tl.int64)
    h = pid_bh % HQ
    j = h // G
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_D)
    row_ok = offs_m < T
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
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_ok = offs_n < T
        k = tl.load(k_base + offs_n[:, None] * s_kt + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        v = tl.load(v_base + offs_n[:, None] * s_kt + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        s = mm(q, tl.trans(k), PREC) * qk_scale
        ok = (offs_n[None, :] <= offs_m[:, None]) & col_ok[None, :] & row_ok[:, None]
        p = tl.where(ok, tl.exp2(s - lse[:, None]), 0.0)
        dp = mm(do, tl.trans(v), PREC)
        ds = p * (dp - delta[:, None])
        dq += mm(ds.to(k.dtype), k, PREC)

    if HAS_DEPTH:
        n_cols = T * L
        dep_lo, dep_hi = _depth_span(pid_m, seq_hi, n_cols, L, BLOCK_M, SPAN_ALL)
        kd_base = KD + b * s_db + j * s_dh
        vd_base = VD + b * s_db + j * s_dh
        for start_c in range(dep_lo, dep_hi, BLOCK_L):
            offs_c = start_c + tl.arange(0, BLOCK_L)
            col_ok = offs_c < n_cols
            kd = tl.load(kd_base + offs_c[:, None] * s_dc + offs_d[None, :], mask=col_ok[:, None], other=0.0)
            vd = tl.load(vd_base + offs_c[:, None] * s_dc + offs_d[None, :], mask=col_ok[:, None], other=0.0)
            s = mm(q, tl.trans(kd), PREC) * qk_scale
            ok = ((offs_c // L)[None, :] == offs_m[:, None]) & col_ok[None, :] & row_ok[:, None]
            p = tl.where(ok, tl.exp2(s - lse[:, None]), 0.0)
            dp = mm(do, tl.trans(vd), PREC)
            ds = p * (dp - delta[:, None])
            dq += mm(ds.to(kd.dtype), kd, PREC)

    tl.store(DQ + q_off, (dq * sm_scale).to(DQ.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV,
    s_qb, s_qt, s_qh, s_kb, s_kt, s_kh,
    T, G, HQ, HK, qk_scale, sm_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr, PREC: tl.constexpr,
):
    """dK, dV of BLOCK_N sequence keys of one KV head, summed over its G query heads
    (k, v, dK, dV share the (B,T,HK,D) strides)."""
    pid_n = tl.program_id(0)
    pid_bj = tl.program_id(1)
    b = (pid_bj // HK).to(tl.int64)
    j = pid_bj % HK
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_D)
    col_ok = offs_n < T
    kv_off = b * s_kb + offs_n[:, None] * s_kt + j * s_kh + offs_d[None, :]
    k = tl.load(K + kv_off, mask=col_ok[:, None], other=0.0)
    v = tl.load(V + kv_off, mask=col_ok[:, None], other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_D], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_D], tl.float32)
    q_lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M
    for g in range(0, G):
        h = j * G + g
        row_base = (b * HQ + h) * T
        for start_m in range(q_lo, T, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            row_ok = offs_m < T
            q_off = b * s_qb + offs_m[:, None] * s_qt + h * s_qh + offs_d[None, :]
            q = tl.load(Q + q_off, mask=row_ok[:, None], other=0.0)
            do = tl.load(DO + q_off, mask=row_ok[:, None], other=0.0)
            lse = tl.load(LSE + row_base + offs_m, mask=row_ok, other=0.0)
            delta = tl.load(DELTA + row_base + offs_m, mask=row_ok, other=0.0)
            s_t = mm(k, tl.trans(q), PREC) * qk_scale  # (BLOCK_N, BLOCK_M)
            ok = (offs_m[None, :] >= offs_n[:, None]) & row_ok[None, :] & col_ok[:, None]
            p_t = tl.where(ok, tl.exp2(s_t - lse[None, :]), 0.0)
            dv += mm(p_t.to(do.dtype), do, PREC)
            dp_t = mm(v, tl.trans(do), PREC)
            ds_t = p_t * (dp_t - delta[None, :])
            dk += mm(ds_t.to(q.dtype), q, PREC)
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
    pid_c = tl.program_id(0)
    pid_bj = tl.program_id(1)
    b = (pid_bj // HK).to(tl.int64)
    j = pid_bj % HK
    n_cols = T * L
    offs_c = pid_c * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_d = tl.arange(0, HEAD_D)
    col_ok = offs_c < n_cols
    pos = offs_c // L
    d_off = b * s_db + offs_c[:, None] * s_dc + j * s_dh + offs_d[None, :]
    kd = tl.load(KD + d_off, mask=col_ok[:, None], other=0.0)
    vd = tl.load(VD + d_off, mask=col_ok[:, None], other=0.0)
    dkd = tl.zeros([BLOCK_D, HEAD_D], tl.float32)
    dvd = tl.zeros([BLOCK_D, HEAD_D], tl.float32)
    if SPAN_ALL:
        q_lo = 0
        q_hi = T
    else:
        q_lo = ((pid_c * BLOCK_D) // (BLOCK_M * L)) * BLOCK_M
        q_hi = tl.minimum(q_lo + BLOCK_M, T)
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
            s_t = mm(kd, tl.trans(q), PREC) * qk_scale  # (BLOCK_D, BLOCK_M)
            ok = (pos[:, None] == offs_m[None, :]) & col_ok[:, None] & row_ok[None, :]
            p_t = tl.where(ok, tl.exp2(s_t - lse[None, :]), 0.0)
            dvd += mm(p_t.to(do.dtype), do, PREC)
            dp_t = mm(vd, tl.trans(do), PREC)
            ds_t = p_t * (dp_t - delta[None, :])
            dkd += mm(ds_t.to(q.dtype), q, PREC)
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
        grid = (triton.cdiv(T, chunk), B * Hq)
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
        _bwd_dq_kernel[(triton.cdiv(T, chunk), B * Hq)](
            q, k, v, kd, vd, do, lse, delta, dq,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            kd.stride(0), kd.stride(1), kd.stride(2),
            T, max(L, 1), G, Hq, qk_scale, sm_scale,
            HEAD_D=d, HAS_DEPTH=has_depth, SPAN_ALL=span_all, PREC=prec, **tile,
        )
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        _bwd_dkdv_kernel[(triton.cdiv(T, tile["BLOCK_N"]), B * Hk)](
            q, k, v, do, lse, delta, dk, dv,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            T, G, Hq, Hk, qk_scale, sm_scale,
            BLOCK_M=chunk, BLOCK_N=tile["BLOCK_N"], HEAD_D=d, PREC=prec,
            num_warps=tile["num_warps"], num_stages=tile["num_stages"],
        )
        dkd = dvd = None
        if has_depth:
            dkd, dvd = torch.empty_like(kd), torch.empty_like(vd)
            _bwd_depth_kernel[(triton.cdiv(T * L, tile["BLOCK_L"]), B * Hk)](
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
