"""The fused Triton MoDA kernel (forward + backward) and `moda_attention`.

Layouts (user-facing, spec section 1): q (B, T, Hq, d); k, v (B, T, Hk, d);
k_depth, v_depth (B, T, L, Hk, d); out (B, T, Hq, d); lse (B, T, Hq) float32.

Design (group-aware, then batched depth tiles):
* Rows. For KV head j the G query heads h = j*G + g are folded into the row axis through
  strides, r = t*GP + g with GP = next_pow2(G) (rows with g >= G are masked). A block of
  BLOCK_M rows covers P = BLOCK_M // GP whole positions, so K/V tiles are shared by the G
  heads and the causal diagonal is only P positions wide.
* Sequence phase: causal flash-attention loop over key tiles; unmasked below the diagonal.
* Depth phase: the P positions are cut into NB = P // S sub-tiles of S positions. A
  batched (3-D) matmul computes, for each sub-tile, its S*GP rows against the flat S*L depth
  columns of *its own* positions only, BLOCK_L columns a step, masked to the block diagonal.
  S = P is the paper's dense group-aware tile (utilisation G/C); the default S is the fewest
  positions that fill a 16-row tensor-core tile (utilisation min(1, G/16) for L >= BLOCK_L).
  Sequence and depth logits share one online-softmax state.
* Backward: a query-major pass computes dq (sequence + depth) and the depth gradients
  dk_depth, dv_depth (a depth entry is read only by the rows of its own position, all inside
  one block, so no atomics); a key-major pass computes dk, dv. delta = rowsum(o * do) comes
  from a small preprocessing kernel. No scratch buffer beyond dq's fp32 accumulator tile.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .triton_utils import dot_precision, mm
from .config import MoDAConfig, auto_depth_sub, group_pad, resolve_config
from .validate import MoDAShape, check_inputs

LOG2E = 1.4426950408889634
NEG = tl.constexpr(-1.0e30)  # finite "minus infinity": fully masked (padding) rows stay finite


# --------------------------------------------------------------------------------------------
# helpers used inside kernels
# --------------------------------------------------------------------------------------------
@triton.jit
def _row_ptrs(base, b, j, rows, offs_d, G, sb, st, sh, GP: tl.constexpr):
    """Pointers [rows, d] into a (B, T, Hq, d) tensor for folded rows r = t*GP + g of KV head j."""
    t = rows // GP
    g = rows % GP
    return base + b * sb + t[:, None] * st + (j * G + g)[:, None] * sh + offs_d[None, :]


@triton.jit
def _depth_tile(t_lo, f0, T, L, sdt, sdl, NB: tl.constexpr, S: tl.constexpr, R: tl.constexpr, GP: tl.constexpr,
                BLOCK_L: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Depth step f0 of a block whose first position is t_lo, cut into NB sub-tiles of S positions.

    Returns (offs [NB, BLOCK_L, d] element offsets of the depth entries relative to the
    (b, KV head) base, ld_ok [NB, BLOCK_L, 1] load mask, own [NB, R, BLOCK_L] score mask).
    Flat column f (0 <= f < S*L) of sub-tile nb is depth entry f % L of position
    t_lo + nb*S + f // L; row rr of the sub-tile belongs to position t_lo + nb*S + rr // GP.
    """
    offs_d = tl.arange(0, HEAD_DIM)
    f = f0 + tl.arange(0, BLOCK_L)
    nb = tl.arange(0, NB)
    # load side [NB, BLOCK_L, 1]
    f_l = f[None, :, None]
    pos_l = t_lo + nb[:, None, None] * S + f_l // L
    ld_ok = (f_l < S * L) & (pos_l < T)
    offs = pos_l * sdt + (f_l % L) * sdl + offs_d[None, None, :]
    # score side [NB, R, BLOCK_L]
    f_s = f[None, None, :]
    pos_s = t_lo + nb[:, None, None] * S + f_s // L
    rr = tl.arange(0, R)[None, :, None]
    own = ((rr // GP) == (f_s // L)) & (f_s < S * L) & (pos_s < T)
    return offs, ld_ok, own


@triton.jit
def _softmax_update(s, m_i, l_i):
    """Online-softmax step for log2-scaled scores s [rows, cols]: returns (p, alpha, m_new,
    l_new) with p = exp2(s - m_new) and alpha the factor rescaling earlier sums."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _fwd_seq_step(q, acc, m_i, l_i, t, kbase, vbase, start_n, T, skt, svt, qk_scale,
                  BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, PREC: tl.constexpr, MASK: tl.constexpr):
    """Fold one tile of BLOCK_N sequence keys into (acc, m_i, l_i); MASK applies the causal
    mask and the key bound (diagonal tiles)."""
    offs_d = tl.arange(0, HEAD_DIM)
    kn = start_n + tl.arange(0, BLOCK_N)
    if MASK:
        kmask = kn < T
        k = tl.load(kbase + kn[None, :] * skt + offs_d[:, None], mask=kmask[None, :], other=0.0)
        v = tl.load(vbase + kn[:, None] * svt + offs_d[None, :], mask=kmask[:, None], other=0.0)
    else:
        k = tl.load(kbase + kn[None, :] * skt + offs_d[:, None])
        v = tl.load(vbase + kn[:, None] * svt + offs_d[None, :])
    qk = mm(q, k, PREC) * qk_scale
    if MASK:
        qk = tl.where((kn[None, :] <= t[:, None]) & kmask[None, :], qk, NEG)
    p, alpha, m_i, l_i = _softmax_update(qk, m_i, l_i)
    return acc * alpha[:, None] + mm(p.to(v.dtype), v, PREC), m_i, l_i


# --------------------------------------------------------------------------------------------
# forward
# --------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["T", "L"])
def _moda_fwd_kernel(
    Q, K, V, KD, VD, O, LSE,
    qk_scale, T, L, G, Hk,
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh,
    sdb, sdt, sdl, sdh,
    sob, sot, soh, slb, slt, slh,
    GP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    HAS_DEPTH: tl.constexpr, S: tl.constexpr, BLOCK_L: tl.constexpr, PREC: tl.constexpr,
    DEPTH_STAGES: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // Hk
    j = pid_bh % Hk
    P: tl.constexpr = BLOCK_M // GP
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    t = rows // GP
    row_ok = (t < T) & ((rows % GP) < G)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(_row_ptrs(Q, b, j, rows, offs_d, G, sqb, sqt, sqh, GP), mask=row_ok[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], NEG, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    t_lo = pid_m * P
    t_end = tl.minimum(t_lo + P, T)
    n_full = (t_lo // BLOCK_N) * BLOCK_N
    kbase = K + b * skb + j * skh
    vbase = V + b * svb + j * svh
    # keys entirely below the block's first position: no mask; then the diagonal tiles
    for start_n in range(0, n_full, BLOCK_N):
        acc, m_i, l_i = _fwd_seq_step(q, acc, m_i, l_i, t, kbase, vbase, start_n, T, skt, svt, qk_scale,
                                      BLOCK_N, HEAD_DIM, PREC, False)
    for start_n in range(n_full, t_end, BLOCK_N):
        acc, m_i, l_i = _fwd_seq_step(q, acc, m_i, l_i, t, kbase, vbase, start_n, T, skt, svt, qk_scale,
                                      BLOCK_N, HEAD_DIM, PREC, True)

    if HAS_DEPTH:
        NB: tl.constexpr = P // S
        R: tl.constexpr = S * GP
        dbase = b * sdb + j * sdh
        q3 = tl.reshape(q, (NB, R, HEAD_DIM))
        for f0 in tl.range(0, S * L, BLOCK_L, num_stages=DEPTH_STAGES):
            offs, ld_ok, own = _depth_tile(t_lo, f0, T, L, sdt, sdl, NB, S, R, GP, BLOCK_L, HEAD_DIM)
            kd = tl.load(KD + dbase + offs, mask=ld_ok, other=0.0)  # [NB, BLOCK_L, d]
            s3 = mm(q3, tl.trans(kd, 0, 2, 1), PREC) * qk_scale  # [NB, R, BLOCK_L]
            s3 = tl.where(own, s3, NEG)
            p, alpha, m_i, l_i = _softmax_update(tl.reshape(s3, (BLOCK_M, BLOCK_L)), m_i, l_i)
            vd = tl.load(VD + dbase + offs, mask=ld_ok, other=0.0)
            p3 = tl.reshape(p.to(vd.dtype), (NB, R, BLOCK_L))
            pv = tl.reshape(mm(p3, vd, PREC), (BLOCK_M, HEAD_DIM))
            acc = acc * alpha[:, None] + pv

    acc = acc / l_i[:, None]
    lse = (m_i + tl.math.log2(l_i)) / 1.4426950408889634
    tl.store(_row_ptrs(O, b, j, rows, offs_d, G, sob, sot, soh, GP), acc.to(O.dtype.element_ty), mask=row_ok[:, None])
    tl.store(LSE + b * slb + t * slt + (j * G + rows % GP) * slh, lse, mask=row_ok)


# --------------------------------------------------------------------------------------------
# backward
# --------------------------------------------------------------------------------------------
@triton.jit
def _moda_bwd_delta_kernel(O, DO, DELTA, n_rows, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    """delta[row] = sum_d o[row, d] * do[row, d] over the flattened (B*T*Hq, d) view."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    ok = rows < n_rows
    o = tl.load(O + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    tl.store(DELTA + rows, tl.sum(o * do, 1), mask=ok)


@triton.jit
def _bwd_rows(Q, DO, LSE, DELTA, b, j, rows, T, G, sqb, sqt, sqh, sob, sot, soh, slb, slt, slh,
              GP: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Folded rows r = t*GP + g of KV head j: (q, do, lse * log2(e), delta, t, row_ok); padding
    rows (g >= G or t >= T) load zeros, so they add nothing to any gradient."""
    offs_d = tl.arange(0, HEAD_DIM)
    t = rows // GP
    g = rows % GP
    row_ok = (t < T) & (g < G)
    q = tl.load(_row_ptrs(Q, b, j, rows, offs_d, G, sqb, sqt, sqh, GP), mask=row_ok[:, None], other=0.0)
    do = tl.load(_row_ptrs(DO, b, j, rows, offs_d, G, sob, sot, soh, GP), mask=row_ok[:, None], other=0.0)
    lrow = b * slb + t * slt + (j * G + g) * slh
    lse2 = tl.load(LSE + lrow, mask=row_ok, other=0.0) * 1.4426950408889634
    delta = tl.load(DELTA + lrow, mask=row_ok, other=0.0)
    return q, do, lse2, delta, t, row_ok


@triton.jit
def _bwd_q_seq_step(q, do, lse2, delta, t, kbase, vbase, start_n, T, skt, svt, qk_scale,
                    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, PREC: tl.constexpr, MASK: tl.constexpr):
    """dq contribution (unscaled) of one tile of BLOCK_N sequence keys."""
    offs_d = tl.arange(0, HEAD_DIM)
    kn = start_n + tl.arange(0, BLOCK_N)
    if MASK:
        kmask = kn < T
        kT = tl.load(kbase + kn[None, :] * skt + offs_d[:, None], mask=kmask[None, :], other=0.0)
        vT = tl.load(vbase + kn[None, :] * svt + offs_d[:, None], mask=kmask[None, :], other=0.0)
    else:
        kT = tl.load(kbase + kn[None, :] * skt + offs_d[:, None])
        vT = tl.load(vbase + kn[None, :] * svt + offs_d[:, None])
    qk = mm(q, kT, PREC) * qk_scale
    p = tl.math.exp2(qk - lse2[:, None])
    if MASK:
        p = tl.where((kn[None, :] <= t[:, None]) & (kn[None, :] < T), p, 0.0)
    dp = mm(do, vT, PREC)
    ds = p * (dp - delta[:, None])
    return mm(ds.to(kT.dtype), tl.trans(kT), PREC)


@triton.jit
def _bwd_kv_step(k, v, kn, r0, Q, DO, LSE, DELTA, b, j, T, G, qk_scale,
                 sqb, sqt, sqh, sob, sot, soh, slb, slt, slh,
                 GP: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, PREC: tl.constexpr,
                 MASK: tl.constexpr):
    """(dk (unscaled), dv) contributions of BLOCK_M folded query rows starting at r0."""
    rows = r0 + tl.arange(0, BLOCK_M)
    q, do, lse2, delta, t, row_ok = _bwd_rows(Q, DO, LSE, DELTA, b, j, rows, T, G, sqb, sqt, sqh, sob, sot, soh,
                                              slb, slt, slh, GP, HEAD_DIM)
    kq = mm(k, tl.trans(q), PREC) * qk_scale  # [BLOCK_N, BLOCK_M]
    pT = tl.math.exp2(kq - lse2[None, :])
    if MASK:
        pT = tl.where((kn[:, None] <= t[None, :]) & row_ok[None, :], pT, 0.0)
    dv = mm(pT.to(do.dtype), do, PREC)
    dpT = mm(v, tl.trans(do), PREC)
    dsT = pT * (dpT - delta[None, :])
    dk = mm(dsT.to(q.dtype), q, PREC)
    return dk, dv


@triton.jit(do_not_specialize=["T", "L"])
def _moda_bwd_q_kernel(
    Q, K, V, KD, VD, DO, LSE, DELTA, DQ, DKD, DVD,
    qk_scale, sm_scale, T, L, G, Hk,
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh,
    sdb, sdt, sdl, sdh,
    sob, sot, soh, slb, slt, slh,
    GP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    HAS_DEPTH: tl.constexpr, S: tl.constexpr, BLOCK_L: tl.constexpr, PREC: tl.constexpr,
    DEPTH_STAGES: tl.constexpr,
):
    """Query-major pass: dq (sequence + depth), dk_depth, dv_depth. DO/DQ share q's strides
    (sqb...), LSE/DELTA share (slb, slt, slh); KD, VD, DKD, DVD are contiguous with one set of
    strides (sdb, sdt, sdl, sdh)."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // Hk
    j = pid_bh % Hk
    P: tl.constexpr = BLOCK_M // GP
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    q, do, lse2, delta, t, row_ok = _bwd_rows(Q, DO, LSE, DELTA, b, j, rows, T, G, sqb, sqt, sqh, sob, sot, soh,
                                              slb, slt, slh, GP, HEAD_DIM)
    offs_d = tl.arange(0, HEAD_DIM)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    t_lo = pid_m * P
    t_end = tl.minimum(t_lo + P, T)
    n_full = (t_lo // BLOCK_N) * BLOCK_N
    kbase = K + b * skb + j * skh
    vbase = V + b * svb + j * svh
    for start_n in range(0, n_full, BLOCK_N):
        dq += _bwd_q_seq_step(q, do, lse2, delta, t, kbase, vbase, start_n, T, skt, svt, qk_scale,
                              BLOCK_N, HEAD_DIM, PREC, False)
    for start_n in range(n_full, t_end, BLOCK_N):
        dq += _bwd_q_seq_step(q, do, lse2, delta, t, kbase, vbase, start_n, T, skt, svt, qk_scale,
                              BLOCK_N, HEAD_DIM, PREC, True)

    if HAS_DEPTH:
        NB: tl.constexpr = P // S
        R: tl.constexpr = S * GP
        dbase = b * sdb + j * sdh
        q3 = tl.reshape(q, (NB, R, HEAD_DIM))
        do3 = tl.reshape(do, (NB, R, HEAD_DIM))
        lse3 = tl.reshape(lse2, (NB, R, 1))
        delta3 = tl.reshape(delta, (NB, R, 1))
        for f0 in tl.range(0, S * L, BLOCK_L, num_stages=DEPTH_STAGES):
            offs, ld_ok, own = _depth_tile(t_lo, f0, T, L, sdt, sdl, NB, S, R, GP, BLOCK_L, HEAD_DIM)
            kd = tl.load(KD + dbase + offs, mask=ld_ok, other=0.0)
            vd = tl.load(VD + dbase + offs, mask=ld_ok, other=0.0)
            s3 = mm(q3, tl.trans(kd, 0, 2, 1), PREC) * qk_scale
            p3 = tl.math.exp2(s3 - lse3)
            p3 = tl.where(own, p3, 0.0)
            dp3 = mm(do3, tl.trans(vd, 0, 2, 1), PREC)
            ds3 = p3 * (dp3 - delta3)
            dq += tl.reshape(mm(ds3.to(kd.dtype), kd, PREC), (BLOCK_M, HEAD_DIM))
            dvd = mm(tl.trans(p3.to(do.dtype), 0, 2, 1), do3, PREC)
            dkd = mm(tl.trans(ds3.to(q.dtype), 0, 2, 1), q3, PREC) * sm_scale
            tl.store(DKD + dbase + offs, dkd.to(DKD.dtype.element_ty), mask=ld_ok)
            tl.store(DVD + dbase + offs, dvd.to(DVD.dtype.element_ty), mask=ld_ok)

    tl.store(_row_ptrs(DQ, b, j, rows, offs_d, G, sqb, sqt, sqh, GP), (dq * sm_scale).to(DQ.dtype.element_ty),
             mask=row_ok[:, None])


@triton.jit(do_not_specialize=["T"])
def _moda_bwd_kv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV,
    qk_scale, sm_scale, T, G, Hk,
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh,
    sob, sot, soh, slb, slt, slh,
    GP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    PREC: tl.constexpr,
):
    """Key-major pass: dk, dv of BLOCK_N keys, looping over the folded query rows that see
    them. DK/DV share k's strides (skb...)."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // Hk
    j = pid_bh % Hk
    offs_d = tl.arange(0, HEAD_DIM)
    n0 = pid_n * BLOCK_N
    kn = n0 + tl.arange(0, BLOCK_N)
    kmask = kn < T
    k = tl.load(K + b * skb + kn[:, None] * skt + j * skh + offs_d[None, :], mask=kmask[:, None], other=0.0)
    v = tl.load(V + b * svb + kn[:, None] * svt + j * svh + offs_d[None, :], mask=kmask[:, None], other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    # rows whose position is inside the key tile see masked keys; later rows see all of them
    r_diag_end = tl.minimum(n0 + BLOCK_N, T) * GP
    r_end = T * GP
    for r0 in range(n0 * GP, r_diag_end, BLOCK_M):
        dk_i, dv_i = _bwd_kv_step(k, v, kn, r0, Q, DO, LSE, DELTA, b, j, T, G, qk_scale,
                                  sqb, sqt, sqh, sob, sot, soh, slb, slt, slh, GP, BLOCK_M, HEAD_DIM, PREC, True)
        dk += dk_i
        dv += dv_i
    r_un = n0 * GP + tl.cdiv(r_diag_end - n0 * GP, BLOCK_M) * BLOCK_M
    for r0 in range(r_un, r_end, BLOCK_M):
        dk_i, dv_i = _bwd_kv_step(k, v, kn, r0, Q, DO, LSE, DELTA, b, j, T, G, qk_scale,
                                  sqb, sqt, sqh, sob, sot, soh, slb, slt, slh, GP, BLOCK_M, HEAD_DIM, PREC, False)
        dk += dk_i
        dv += dv_i
    tl.store(DK + b * skb + kn[:, None] * skt + j * skh + offs_d[None, :], (dk * sm_scale).to(DK.dtype.element_ty),
             mask=kmask[:, None])
    tl.store(DV + b * svb + kn[:, None] * svt + j * svh + offs_d[None, :], dv.to(DV.dtype.element_ty),
             mask=kmask[:, None])


# --------------------------------------------------------------------------------------------
# launchers
# --------------------------------------------------------------------------------------------
def _depth_sub(cfg: MoDAConfig, G: int, block_m: int) -> int:
    s = cfg.depth_sub or auto_depth_sub(G, block_m)
    P = block_m // group_pad(G)
    if P % s != 0 or s * group_pad(G) < 16:
        raise ValueError(f"config depth_sub={cfg.depth_sub} invalid for G={G}, block_m={block_m}: need a divisor "
                         f"of {P} positions with depth_sub*{group_pad(G)} >= 16")
    return s


def check_config(cfg: MoDAConfig, G: int) -> None:
    """Raise ValueError if cfg cannot run for group size G."""
    gp = group_pad(G)
    for name in ("block_m", "bwd_q_block_m"):
        bm = getattr(cfg, name)
        if bm < 16 or bm & (bm - 1) or bm % gp:
            raise ValueError(f"config {name}={bm} must be a power of two >= 16 and a multiple of GP={gp} (G={G})")
        _depth_sub(cfg, G, bm)
    for name in ("block_n", "bwd_q_block_n", "bwd_kv_block_m", "bwd_kv_block_n", "block_l"):
        v = getattr(cfg, name)
        if v < 16 or v & (v - 1):
            raise ValueError(f"config {name}={v} must be a power of two >= 16")


def depth_utilization(T: int, G: int, C: int, L: int, config: MoDAConfig | None = None) -> float:
    """Useful depth logits / depth logits this kernel computes in the forward (spec section 2).

    A sub-tile of S positions has S*GP rows and computes ceil(S*L/BLOCK_L)*BLOCK_L columns
    for each of them; S*G*L of those logits are needed.
    """
    if L == 0:
        return float("nan")
    cfg = config or MoDAConfig(block_m=max(C, group_pad(G)))
    bm = cfg.block_m
    S = _depth_sub(cfg, G, bm)
    cols = triton.cdiv(S * L, cfg.block_l) * cfg.block_l
    return (S * G * L) / (S * group_pad(G) * cols)


def _fwd(q, k, v, kd, vd, scale, shape: MoDAShape, cfg: MoDAConfig):
    B, T, Hq, d = q.shape
    Hk, G, L = shape.Hk, shape.G, shape.L
    gp = group_pad(G)
    o = torch.empty_like(q)
    lse = torch.empty((B, T, Hq), device=q.device, dtype=torch.float32)
    has_depth = L > 0
    kd_, vd_ = (kd, vd) if has_depth else (k.unsqueeze(2), v.unsqueeze(2))
    S = _depth_sub(cfg, G, cfg.block_m)
    grid = (triton.cdiv(T * gp, cfg.block_m), B * Hk)
    _moda_fwd_kernel[grid](
        q, k, v, kd_, vd_, o, lse,
        scale * LOG2E, T, L, G, Hk,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        kd_.stride(0), kd_.stride(1), kd_.stride(2), kd_.stride(3),
        o.stride(0), o.stride(1), o.stride(2), lse.stride(0), lse.stride(1), lse.stride(2),
        GP=gp, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HEAD_DIM=d, HAS_DEPTH=has_depth, S=S,
        BLOCK_L=cfg.block_l, PREC=dot_precision(q.dtype), DEPTH_STAGES=cfg.depth_stages, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return o, lse


def _bwd(do, q, k, v, kd, vd, o, lse, scale, shape: MoDAShape, cfg: MoDAConfig):
    B, T, Hq, d = q.shape
    Hk, G, L = shape.Hk, shape.G, shape.L
    gp = group_pad(G)
    do = do.contiguous()
    delta = torch.empty_like(lse)
    n_rows = B * T * Hq
    _moda_bwd_delta_kernel[(triton.cdiv(n_rows, 128),)](o, do, delta, n_rows, HEAD_DIM=d, BLOCK=128)
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    has_depth = L > 0
    if has_depth:
        dkd = torch.empty_like(kd)
        dvd = torch.empty_like(vd)
        kd_, vd_, dkd_, dvd_ = kd, vd, dkd, dvd
    else:
        dkd = dvd = None
        kd_, vd_ = k.unsqueeze(2), v.unsqueeze(2)
        dkd_, dvd_ = kd_, vd_  # never written (HAS_DEPTH=False)
    prec = dot_precision(q.dtype)
    S = _depth_sub(cfg, G, cfg.bwd_q_block_m)
    _moda_bwd_q_kernel[(triton.cdiv(T * gp, cfg.bwd_q_block_m), B * Hk)](
        q, k, v, kd_, vd_, do, lse, delta, dq, dkd_, dvd_,
        scale * LOG2E, scale, T, L, G, Hk,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        kd_.stride(0), kd_.stride(1), kd_.stride(2), kd_.stride(3),
        do.stride(0), do.stride(1), do.stride(2), lse.stride(0), lse.stride(1), lse.stride(2),
        GP=gp, BLOCK_M=cfg.bwd_q_block_m, BLOCK_N=cfg.bwd_q_block_n, HEAD_DIM=d, HAS_DEPTH=has_depth, S=S,
        BLOCK_L=cfg.block_l, PREC=prec, DEPTH_STAGES=cfg.depth_stages, num_warps=cfg.bwd_q_warps, num_stages=cfg.bwd_q_stages,
    )
    _moda_bwd_kv_kernel[(triton.cdiv(T, cfg.bwd_kv_block_n), B * Hk)](
        q, k, v, do, lse, delta, dk, dv,
        scale * LOG2E, scale, T, G, Hk,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        do.stride(0), do.stride(1), do.stride(2), lse.stride(0), lse.stride(1), lse.stride(2),
        GP=gp, BLOCK_M=cfg.bwd_kv_block_m, BLOCK_N=cfg.bwd_kv_block_n, HEAD_DIM=d, PREC=prec,
        num_warps=cfg.bwd_kv_warps, num_stages=cfg.bwd_kv_stages,
    )
    return dq, dk, dv, dkd, dvd


class _MoDAFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, kd, vd, scale, shape, cfg):
        o, lse = _fwd(q, k, v, kd, vd, scale, shape, cfg)
        ctx.save_for_backward(q, k, v, kd, vd, o, lse)
        ctx.scale, ctx.shape, ctx.cfg = scale, shape, cfg
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, kd, vd, o, lse = ctx.saved_tensors
        dq, dk, dv, dkd, dvd = _bwd(do, q, k, v, kd, vd, o, lse, ctx.scale, ctx.shape, ctx.cfg)
        return dq, dk, dv, dkd, dvd, None, None, None


def moda_attention(q, k, v, k_depth=None, v_depth=None, *, scale: float | None = None, return_lse: bool = False,
                   config: MoDAConfig | None = None):
    """Mixture-of-Depths Attention (fused Triton kernel, autograd-enabled).

    q (B,T,Hq,d); k, v (B,T,Hk,d); k_depth, v_depth (B,T,L,Hk,d) or None (L = 0: causal GQA).
    Each query attends causally to the sequence keys and to the L depth keys of its own
    position, under one softmax. Returns out (B,T,Hq,d) in q's dtype, and lse (B,T,Hq) float32
    (natural log) when return_lse. `config` pins the tile shapes (default: tuning cache, then
    a heuristic). Gradients flow to all five inputs.
    """
    shape = check_inputs(q, k, v, k_depth, v_depth, need_cuda=True)
    if shape.L == 0:
        k_depth = v_depth = None
    cfg = resolve_config(shape, q.dtype, config)
    check_config(cfg, shape.G)
    scale = 1.0 / math.sqrt(shape.d) if scale is None else float(scale)
    q, k, v, k_depth, v_depth = (None if t is None else t.contiguous() for t in (q, k, v, k_depth, v_depth))
    o, lse = _MoDAFunction.apply(q, k, v, k_depth, v_depth, scale, shape, cfg)
    return (o, lse) if return_lse else o
