"""The ladder's Triton MoDA kernel: ONE forward and backward whose constexpr switches turn on the
paper's ideas one at a time (rungs flash-compatible -> chunk-aware -> group-aware -> depth-bwd-in-dq
of `ladder.table`), so the gain between two rungs is the gain of the one switch they differ in.

Every variant shares its tiles (`tiles`: BLOCK_M = C rows, key/depth steps of min(C, 64)), its
online softmax (sequence then depth logits of a row block under one softmax), its masks and its
backward split. The switches (`Ideas`):

  span_all     True: the depth cache is one flat axis of T*L columns (`k_depth.view(B, T*L, Hk, d)`)
               and every row block scans all of it, masked to column c // L == the row's position
               (flash-compatible, eta = 1/T). False: a block scans only the columns of the positions
               it covers (chunk-aware, eta = 1/C ungrouped).
  grouped      False: a program's rows are C positions of ONE query head (grid over B*Hq), so the K/V
               and depth tiles of a KV head are read by each of its G query heads. True: the G query
               heads of a KV head are folded into the rows, r = t*GP + g (GP = next_pow2(G), rows
               g >= G masked; grid over B*Hk), so a row block of C rows covers C/GP positions and its
               sequence and depth K/V tiles are read once for the whole group (group-aware, eta = G/C).
  depth_in_dq  (needs grouped, not span_all) the depth gradients dk_depth, dv_depth are computed in the
               query-major backward pass from the probabilities it already has: grouped and chunked,
               a depth column is read by the rows of exactly one program, so no atomics and no third
               (depth-major) pass that reloads q, dO, lse and delta.

Backward (deterministic, no atomics), after delta = rowsum(dO * O) in PyTorch:
  1. query-major pass, grid as the forward: dq from the sequence keys and the depth span (and, with
     depth_in_dq, dk_depth / dv_depth of that span);
  2. key-major pass, grid (T/BLOCK_N, B*Hk): dk, dv of a key tile, over the row blocks at or after it
     (G head-by-head sweeps ungrouped, one folded sweep grouped);
  3. without depth_in_dq, a depth-major pass, grid (T*L/BLOCK_L, B*Hk): dk_depth, dv_depth of a tile of
     flat depth columns over the rows of its span (all rows for span_all, else those of the chunks
     owning its columns).
The forward stores lse (log2 domain) as (B, Hq, T).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from moda_bench.kernels.launch import cdiv, next_pow2
from moda_bench.kernels.moda.triton.utils import dot_precision, mm
from moda_bench.kernels.moda.validate import check_inputs

LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class Ideas:
    """Which of the kernel's switches are on (see the module docstring)."""

    span_all: bool = False
    grouped: bool = False
    depth_in_dq: bool = False

    def check(self) -> "Ideas":
        if self.depth_in_dq and (self.span_all or not self.grouped):
            raise ValueError("depth_in_dq needs grouped rows and the chunk span (a depth column must belong to "
                             "the rows of one program)")
        return self


@triton.jit
def _unit(pid_u, G, HQ, HK, GROUPED: tl.constexpr):
    """Program unit pid_u of grid axis 1 -> (b, KV head j, first query head of the rows, heads in the rows)."""
    if GROUPED:
        b = pid_u // HK
        j = pid_u % HK
        base = j * G
        n_g = G
    else:
        b = pid_u // HQ
        base = pid_u % HQ
        j = base // G
        n_g = 1
    return b.to(tl.int64), j, base, n_g


@triton.jit
def _rows(r0, base, n_g, T, GP: tl.constexpr, BLOCK_M: tl.constexpr):
    """Rows r0 .. r0+BLOCK_M-1 folded as r = t*GP + g: (position t, query head base + g, row valid)."""
    r = r0 + tl.arange(0, BLOCK_M)
    pos = r // GP
    g = r % GP
    return pos, base + g, (pos < T) & (g < n_g)


@triton.jit
def _depth_span(pid_m, T, L, P: tl.constexpr, SPAN_ALL: tl.constexpr):
    """The flat depth columns [lo, hi) row block pid_m scans: all T*L (flash-compatible) or only those of
    its own positions pid_m*P .. (chunk-aware; P = positions a block)."""
    if SPAN_ALL:
        lo = 0
        hi = T * L
    else:
        lo = pid_m * P * L
        hi = tl.minimum(pid_m * P + P, T) * L
    return lo, hi


@triton.jit
def _kv_tiles(k_base, v_base, start, n_keys, stride, offs_d, pos, L, OWN: tl.constexpr, BLOCK: tl.constexpr):
    """Keys start .. start+BLOCK-1 (rows at or past n_keys read as zeros), their values, and which
    (row, key) scores count: (k, v, ok, key offsets). Sequence keys count up to the row's position
    (causal); with OWN, flat depth columns c count for position c // L."""
    offs = start + tl.arange(0, BLOCK)
    col_ok = offs < n_keys
    if OWN:
        ok = ((offs // L)[None, :] == pos[:, None]) & col_ok[None, :]
    else:
        ok = (offs[None, :] <= pos[:, None]) & col_ok[None, :]
    return (tl.load(k_base + offs[:, None] * stride + offs_d[None, :], mask=col_ok[:, None], other=0.0),
            tl.load(v_base + offs[:, None] * stride + offs_d[None, :], mask=col_ok[:, None], other=0.0), ok, offs)


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
def _dq_parts(q, do, lse, delta, k, v, ok, qk_scale, PREC: tl.constexpr):
    """One tile of keys k, values v (scores masked to ok): (unscaled dq share, p, ds)."""
    s = mm(q, tl.trans(k), PREC) * qk_scale
    p = tl.where(ok, tl.exp2(s - lse[:, None]), 0.0)
    dp = mm(do, tl.trans(v), PREC)
    ds = p * (dp - delta[:, None])
    return mm(ds.to(k.dtype), k, PREC), p, ds


@triton.jit
def _fwd_kernel(
    Q, K, V, KD, VD, O, LSE,
    s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_db, s_dc, s_dh, s_ob, s_ot, s_oh,
    T, L, G, HQ, HK, qk_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr, HEAD_D: tl.constexpr, GP: tl.constexpr,
    HAS_DEPTH: tl.constexpr, SPAN_ALL: tl.constexpr, GROUPED: tl.constexpr, PREC: tl.constexpr,
):
    """O (B,T,HQ,D) and LSE (B,HQ,T, log2 domain) of one block of BLOCK_M rows."""
    P: tl.constexpr = BLOCK_M // GP
    pid_m = tl.program_id(0)
    b, j, base, n_g = _unit(tl.program_id(1), G, HQ, HK, GROUPED)
    pos, head, row_ok = _rows(pid_m * BLOCK_M, base, n_g, T, GP, BLOCK_M)
    offs_d = tl.arange(0, HEAD_D)
    q = tl.load(Q + b * s_qb + pos[:, None] * s_qt + head[:, None] * s_qh + offs_d[None, :], mask=row_ok[:, None],
                other=0.0)
    k_base = K + b * s_kb + j * s_kh
    v_base = V + b * s_kb + j * s_kh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_D], tl.float32)

    # sequence phase: causal keys 0 .. the block's last position (key 0 keeps every row's max finite)
    seq_hi = tl.minimum(pid_m * P + P, T)
    for start_n in range(0, seq_hi, BLOCK_N):
        k, v, ok, offs_n = _kv_tiles(k_base, v_base, start_n, T, s_kt, offs_d, pos, L, False, BLOCK_N)
        acc, m_i, l_i = _softmax_tile(q, k, v, ok, acc, m_i, l_i, qk_scale, PREC)
    # depth phase: flat depth columns c = t * L + l of the span, masked to c // L == the row's position
    if HAS_DEPTH:
        dep_lo, dep_hi = _depth_span(pid_m, T, L, P, SPAN_ALL)
        kd_base = KD + b * s_db + j * s_dh
        vd_base = VD + b * s_db + j * s_dh
        for start_c in range(dep_lo, dep_hi, BLOCK_L):
            kd, vd, own, offs_c = _kv_tiles(kd_base, vd_base, start_c, T * L, s_dc, offs_d, pos, L, True, BLOCK_L)
            acc, m_i, l_i = _softmax_tile(q, kd, vd, own, acc, m_i, l_i, qk_scale, PREC)

    out = acc / l_i[:, None]
    tl.store(O + b * s_ob + pos[:, None] * s_ot + head[:, None] * s_oh + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=row_ok[:, None])
    tl.store(LSE + (b * HQ + head) * T + pos, m_i + tl.log2(l_i), mask=row_ok)


@triton.jit
def _bwd_dq_kernel(
    Q, K, V, KD, VD, DO, LSE, DELTA, DQ, DKD, DVD,
    s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_db, s_dc, s_dh,
    T, L, G, HQ, HK, qk_scale, sm_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr, HEAD_D: tl.constexpr, GP: tl.constexpr,
    HAS_DEPTH: tl.constexpr, SPAN_ALL: tl.constexpr, GROUPED: tl.constexpr, DEPTH_IN_DQ: tl.constexpr,
    PREC: tl.constexpr,
):
    """dQ of one block of rows (q, dO, dQ share the (B,T,HQ,D) strides); with DEPTH_IN_DQ also dK_depth,
    dV_depth of the block's depth columns (kd, vd, dKd, dVd share the flat strides)."""
    P: tl.constexpr = BLOCK_M // GP
    pid_m = tl.program_id(0)
    b, j, base, n_g = _unit(tl.program_id(1), G, HQ, HK, GROUPED)
    pos, head, row_ok = _rows(pid_m * BLOCK_M, base, n_g, T, GP, BLOCK_M)
    offs_d = tl.arange(0, HEAD_D)
    q_off = b * s_qb + pos[:, None] * s_qt + head[:, None] * s_qh + offs_d[None, :]
    q = tl.load(Q + q_off, mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + q_off, mask=row_ok[:, None], other=0.0)
    r_off = (b * HQ + head) * T + pos
    lse = tl.load(LSE + r_off, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + r_off, mask=row_ok, other=0.0)
    k_base = K + b * s_kb + j * s_kh
    v_base = V + b * s_kb + j * s_kh
    dq = tl.zeros([BLOCK_M, HEAD_D], tl.float32)

    seq_hi = tl.minimum(pid_m * P + P, T)
    for start_n in range(0, seq_hi, BLOCK_N):
        k, v, ok, offs_n = _kv_tiles(k_base, v_base, start_n, T, s_kt, offs_d, pos, L, False, BLOCK_N)
        part, p_seq, ds_seq = _dq_parts(q, do, lse, delta, k, v, ok & row_ok[:, None], qk_scale, PREC)
        dq += part

    if HAS_DEPTH:
        dep_lo, dep_hi = _depth_span(pid_m, T, L, P, SPAN_ALL)
        d_base = b * s_db + j * s_dh
        for start_c in range(dep_lo, dep_hi, BLOCK_L):
            kd, vd, own, offs_c = _kv_tiles(KD + d_base, VD + d_base, start_c, T * L, s_dc, offs_d, pos, L, True,
                                            BLOCK_L)
            part, p, ds = _dq_parts(q, do, lse, delta, kd, vd, own & row_ok[:, None], qk_scale, PREC)
            dq += part
            if DEPTH_IN_DQ:  # this block's rows are the only readers of its columns [dep_lo, dep_hi)
                mine = (offs_c < dep_hi)[:, None]
                c_off = d_base + offs_c[:, None] * s_dc + offs_d[None, :]
                dvd = mm(tl.trans(p.to(do.dtype)), do, PREC)
                dkd = mm(tl.trans(ds.to(q.dtype)), q, PREC) * sm_scale
                tl.store(DVD + c_off, dvd.to(DVD.dtype.element_ty), mask=mine)
                tl.store(DKD + c_off, dkd.to(DKD.dtype.element_ty), mask=mine)

    tl.store(DQ + q_off, (dq * sm_scale).to(DQ.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _key_tile(K, V, n_keys, s_b, s_t, s_h, HK, BLOCK: tl.constexpr, HEAD_D: tl.constexpr):
    """This program's tile of BLOCK keys (sequence keys, or flat depth columns) of one KV head, grid
    (n_keys/BLOCK, B*HK): (pid, b, KV head j, offs, col_ok, element offsets, k, v); dK, dV share them."""
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
def _kv_grads(k, v, key_pos, col_ok, dk, dv, Q, DO, LSE, DELTA, b, j, r_lo, r_hi, s_qb, s_qt, s_qh,
              T, G, HQ, qk_scale, BLOCK_M: tl.constexpr, HEAD_D: tl.constexpr, GP: tl.constexpr,
              GROUPED: tl.constexpr, OWN: tl.constexpr, PREC: tl.constexpr):
    """Add to (dk (unscaled), dv) of a tile of keys k, values v at positions key_pos what the G query heads of
    KV head j contribute from rows r_lo..r_hi: one folded sweep (GROUPED) or one sweep per head. A row sees the
    keys at or before its position (sequence keys) or, with OWN, those of its own position (depth)."""
    offs_d = tl.arange(0, HEAD_D)
    n_sweeps = G
    if GROUPED:
        n_sweeps = 1
    for u in range(0, n_sweeps):
        if GROUPED:
            base = j * G
            n_g = G
        else:
            base = j * G + u
            n_g = 1
        for r0 in range(r_lo, r_hi, BLOCK_M):
            pos, head, row_ok = _rows(r0, base, n_g, T, GP, BLOCK_M)
            q_off = b * s_qb + pos[:, None] * s_qt + head[:, None] * s_qh + offs_d[None, :]
            q = tl.load(Q + q_off, mask=row_ok[:, None], other=0.0)
            do = tl.load(DO + q_off, mask=row_ok[:, None], other=0.0)
            r_off = (b * HQ + head) * T + pos
            lse = tl.load(LSE + r_off, mask=row_ok, other=0.0)
            delta = tl.load(DELTA + r_off, mask=row_ok, other=0.0)
            s_t = mm(k, tl.trans(q), PREC) * qk_scale  # (keys, BLOCK_M)
            if OWN:
                seen = key_pos[:, None] == pos[None, :]
            else:
                seen = pos[None, :] >= key_pos[:, None]
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
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr, GP: tl.constexpr, GROUPED: tl.constexpr,
    PREC: tl.constexpr,
):
    """dK, dV of BLOCK_N sequence keys of one KV head, summed over its G query heads (k, v, dK, dV share the
    (B,T,HK,D) strides); rows from the block holding the tile's first key to the end."""
    P: tl.constexpr = BLOCK_M // GP
    pid_n, b, j, offs_n, col_ok, kv_off, k, v = _key_tile(K, V, T, s_kb, s_kt, s_kh, HK, BLOCK_N, HEAD_D)
    dk = tl.zeros([BLOCK_N, HEAD_D], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_D], tl.float32)
    r_lo = (pid_n * BLOCK_N // P) * BLOCK_M
    dk, dv = _kv_grads(k, v, offs_n, col_ok, dk, dv, Q, DO, LSE, DELTA, b, j, r_lo, T * GP, s_qb, s_qt, s_qh,
                       T, G, HQ, qk_scale, BLOCK_M, HEAD_D, GP, GROUPED, False, PREC)
    tl.store(DK + kv_off, (dk * sm_scale).to(DK.dtype.element_ty), mask=col_ok[:, None])
    tl.store(DV + kv_off, dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


@triton.jit
def _bwd_depth_kernel(
    Q, KD, VD, DO, LSE, DELTA, DKD, DVD,
    s_qb, s_qt, s_qh, s_db, s_dc, s_dh,
    T, L, G, HQ, HK, qk_scale, sm_scale,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_D: tl.constexpr, GP: tl.constexpr,
    SPAN_ALL: tl.constexpr, GROUPED: tl.constexpr, PREC: tl.constexpr,
):
    """dK_depth, dV_depth of BLOCK_D flat depth columns of one KV head, summed over its G query heads; rows
    scanned: all of them (SPAN_ALL, the mirror of the forward's full scan) or the row blocks owning the
    columns' positions. kd, vd, dKd, dVd share the flat strides."""
    P: tl.constexpr = BLOCK_M // GP
    pid_c, b, j, offs_c, col_ok, d_off, kd, vd = _key_tile(KD, VD, T * L, s_db, s_dc, s_dh, HK, BLOCK_D, HEAD_D)
    dkd = tl.zeros([BLOCK_D, HEAD_D], tl.float32)
    dvd = tl.zeros([BLOCK_D, HEAD_D], tl.float32)
    if SPAN_ALL:
        r_lo = 0
        r_hi = T * GP
    else:
        c_last = tl.minimum(pid_c * BLOCK_D + BLOCK_D, T * L) - 1
        r_lo = ((pid_c * BLOCK_D) // L // P) * BLOCK_M
        r_hi = (c_last // L // P + 1) * BLOCK_M
    dkd, dvd = _kv_grads(kd, vd, offs_c // L, col_ok, dkd, dvd, Q, DO, LSE, DELTA, b, j, r_lo, r_hi, s_qb, s_qt,
                         s_qh, T, G, HQ, qk_scale, BLOCK_M, HEAD_D, GP, GROUPED, True, PREC)
    tl.store(DKD + d_off, (dkd * sm_scale).to(DKD.dtype.element_ty), mask=col_ok[:, None])
    tl.store(DVD + d_off, dvd.to(DVD.dtype.element_ty), mask=col_ok[:, None])


def tiles(chunk: int, d: int) -> dict:
    """Block sizes and launch options shared by every variant: BLOCK_M = C rows; key/depth steps of min(C, 64)."""
    step = min(chunk, 64)
    warps = 4 if chunk * d <= 64 * 64 else 8
    return {"BLOCK_M": chunk, "BLOCK_N": step, "BLOCK_L": step, "num_warps": warps, "num_stages": 2}


def rows_per_position(G: int, ideas: Ideas) -> int:
    """GP: rows a position takes in a row block (next_pow2(G) grouped, else 1)."""
    return next_pow2(G) if ideas.grouped else 1


class _LadderMoDA(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, k_depth, v_depth, sm_scale: float, chunk: int, ideas: Ideas):
        B, T, Hq, d = q.shape
        Hk = k.shape[2]
        G = Hq // Hk
        L = 0 if k_depth is None else k_depth.shape[2]
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        kd = k_depth.contiguous().reshape(B, T * L, Hk, d) if L > 0 else k  # dummy pointer when L == 0
        vd = v_depth.contiguous().reshape(B, T * L, Hk, d) if L > 0 else v
        o = torch.empty_like(q)
        lse = torch.empty(B, Hq, T, device=q.device, dtype=torch.float32)
        gp = rows_per_position(G, ideas)
        _fwd_kernel[(cdiv(T * gp, chunk), B * (Hk if ideas.grouped else Hq))](
            q, k, v, kd, vd, o, lse,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            kd.stride(0), kd.stride(1), kd.stride(2), o.stride(0), o.stride(1), o.stride(2),
            T, max(L, 1), G, Hq, Hk, sm_scale * LOG2E,
            HEAD_D=d, GP=gp, HAS_DEPTH=L > 0, SPAN_ALL=ideas.span_all, GROUPED=ideas.grouped,
            PREC=dot_precision(q.dtype), **tiles(chunk, d),
        )
        ctx.save_for_backward(q, k, v, kd, vd, o, lse)
        ctx.meta = (sm_scale, chunk, ideas, L, k_depth is not None)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, kd, vd, o, lse = ctx.saved_tensors
        sm_scale, chunk, ideas, L, depth_given = ctx.meta
        B, T, Hq, d = q.shape
        Hk = k.shape[2]
        G = Hq // Hk
        gp = rows_per_position(G, ideas)
        do = do.contiguous()
        delta = (do.float() * o.float()).sum(-1).permute(0, 2, 1).contiguous()  # (B, Hq, T)
        prec = dot_precision(q.dtype)
        tile = tiles(chunk, d)
        launch = dict(num_warps=tile["num_warps"], num_stages=tile["num_stages"])
        qk_scale = sm_scale * LOG2E
        in_dq = ideas.depth_in_dq and L > 0
        dq = torch.empty_like(q)
        dkd = dvd = None
        if L > 0:
            dkd, dvd = torch.empty_like(kd), torch.empty_like(vd)
        _bwd_dq_kernel[(cdiv(T * gp, chunk), B * (Hk if ideas.grouped else Hq))](
            q, k, v, kd, vd, do, lse, delta, dq, dkd if in_dq else dq, dvd if in_dq else dq,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            kd.stride(0), kd.stride(1), kd.stride(2),
            T, max(L, 1), G, Hq, Hk, qk_scale, sm_scale,
            HEAD_D=d, GP=gp, HAS_DEPTH=L > 0, SPAN_ALL=ideas.span_all, GROUPED=ideas.grouped, DEPTH_IN_DQ=in_dq,
            PREC=prec, **tile,
        )
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        _bwd_dkdv_kernel[(cdiv(T, tile["BLOCK_N"]), B * Hk)](
            q, k, v, do, lse, delta, dk, dv,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            T, G, Hq, Hk, qk_scale, sm_scale,
            BLOCK_M=chunk, BLOCK_N=tile["BLOCK_N"], HEAD_D=d, GP=gp, GROUPED=ideas.grouped, PREC=prec, **launch,
        )
        if L > 0 and not in_dq:
            _bwd_depth_kernel[(cdiv(T * L, tile["BLOCK_L"]), B * Hk)](
                q, kd, vd, do, lse, delta, dkd, dvd,
                q.stride(0), q.stride(1), q.stride(2), kd.stride(0), kd.stride(1), kd.stride(2),
                T, L, G, Hq, Hk, qk_scale, sm_scale,
                BLOCK_M=chunk, BLOCK_D=tile["BLOCK_L"], HEAD_D=d, GP=gp, SPAN_ALL=ideas.span_all,
                GROUPED=ideas.grouped, PREC=prec, **launch,
            )
        if L > 0:
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


def moda_ladder(q, k, v, k_depth=None, v_depth=None, *, scale: float | None = None, chunk: int = 64,
                ideas: Ideas = Ideas()) -> torch.Tensor:
    """MoDA through the ladder kernel with the given switches on.

    q (B,T,Hq,d); k, v (B,T,Hk,d); k_depth, v_depth (B,T,L,Hk,d) or None -> out (B,T,Hq,d).
    Differentiable w.r.t. all five inputs.
    """
    ideas.check()
    shape = check_inputs(q, k, v, k_depth, v_depth, need_cuda=True)
    check_chunk(chunk)
    if ideas.grouped and chunk % next_pow2(shape.G):
        raise ValueError(f"chunk={chunk} rows must be a multiple of the padded group size {next_pow2(shape.G)} "
                         f"(G={shape.G}) for the group-aware rows")
    sm_scale = 1.0 / math.sqrt(shape.d) if scale is None else float(scale)
    return _LadderMoDA.apply(q, k, v, k_depth, v_depth, sm_scale, chunk, ideas)
