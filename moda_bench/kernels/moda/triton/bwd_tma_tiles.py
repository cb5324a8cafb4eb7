"""The tile-level pieces of the folded-row "tma" backward (`kernel_bwd_tma`, whose docstring gives
the design): a key-major item and its steps (`kv_item`, `_kv_step`, `row_stats`, `chunk_item`,
`store_kv`), a query-major row block (`dq_block`) and its steps (`dq_rows`, `dq_step`), the depth
part of a row block (`depth_part`) and the depth part as an item of the key-major grid
(`depth_item`). All are `triton.jit` helpers, inlined into the kernels that call them:
`kernel_bwd_tma`'s passes, `kernel_depth`'s depth-only backward and experiments/bwd_tma_triton.py's
variants. Host code lives in `kernel_bwd_tma`.
"""
from __future__ import annotations

import triton
import triton.language as tl

from moda_bench.kernels.moda.triton.descriptors import (
    depth_descs,
    depth_descs_at,
    keys_desc,
    keys_tile,
    rows_desc,
    rows_ptr,
    rows_tile,
)
from moda_bench.kernels.moda.triton.utils import exp2_mix, mm, mm_acc


@triton.jit
def row_stats(do, O, odesc, LSE, b, j, t0, T, G, Hk, GP: tl.constexpr, BM: tl.constexpr, D: tl.constexpr,
              USE_DESC: tl.constexpr):
    """(lse2, delta) of the BM folded rows from position t0: lse*log2(e) (+inf on padding rows and
    rows past T, so that their probabilities are exactly 0) and rowsum(o*do) in fp32."""
    r = t0 * GP + tl.arange(0, BM)
    t = r // GP
    row_ok = (t < T) & (r % GP < G)
    lse = tl.load(LSE + ((b * T + t).to(tl.int64) * (G * Hk) + j * G + r % GP), mask=row_ok, other=0.0)
    lse2 = tl.where(row_ok, lse * 1.4426950408889634, float("inf"))
    o = rows_tile(O, odesc, b, j, 0, t0, T, G, G * Hk, GP, BM, D, USE_DESC).to(tl.float32)
    delta = tl.sum(o * tl.where(row_ok[:, None], do.to(tl.float32), 0.0), 1)
    return lse2, delta


@triton.jit
def _kv_step(k, v, dk, dv, kn, t0, s, Q, DO, O, LSE, qdesc, dodesc, odesc, LSE2, DELTA, b, j, bh, T, G, Hk, RP,
             qk_scale, GP: tl.constexpr, NSUB: tl.constexpr, BM: tl.constexpr, D: tl.constexpr, MASK: tl.constexpr,
             USE_DESC: tl.constexpr, PREC: tl.constexpr, STATS: tl.constexpr, DP_FIRST: tl.constexpr,
             POLY: tl.constexpr):
    """dk, dv of the key tile += the share of the BM folded rows from position t0: GP // NSUB heads a
    position, sub-group s of the padded group (NSUB = 1: all GP). STATS (NSUB = 1 only): the rows'
    lse2 and delta computed here from lse, o and do (no dq pass before this one), else read from
    the flat buffers the dq pass wrote (row t*GP + g). DP_FIRST: dp^T's product issued before the
    exponentials (`kernel_bwd_rules.dp_first`). POLY: `exp2_mix`'s share on the FMA pipe."""
    if NSUB == 1:  # (this branch compiles to the unsplit pass's code before sub-groups existed)
        q = rows_tile(Q, qdesc, b, j, 0, t0, T, G, G * Hk, GP, BM, D, USE_DESC)
        do = rows_tile(DO, dodesc, b, j, 0, t0, T, G, G * Hk, GP, BM, D, USE_DESC)
        r = t0 * GP + tl.arange(0, BM)
    else:
        GS: tl.constexpr = GP // NSUB
        q = rows_tile(Q, qdesc, b, j, s * GS, t0, T, G, G * Hk, GS, BM, D, USE_DESC)
        do = rows_tile(DO, dodesc, b, j, s * GS, t0, T, G, G * Hk, GS, BM, D, USE_DESC)
        rl = tl.arange(0, BM)
        t = t0 + rl // GS
        r = t * GP + s * GS + rl % GS  # the dq pass's row of each
    if STATS:
        tl.static_assert(NSUB == 1, "the key-major pass computes its rows' statistics only unsplit")
        lse2, delta = row_stats(do, O, odesc, LSE, b, j, t0, T, G, Hk, GP, BM, D, USE_DESC)
    else:
        lse2 = tl.load(LSE2 + bh * RP + r)  # rows past the last position: +inf, written by the dq pass
        delta = tl.load(DELTA + bh * RP + r)
    sT = mm_acc(k, tl.trans(q), None, PREC)  # [BN, BM]
    if DP_FIRST:
        dpT = mm_acc(v, tl.trans(do), None, PREC)
    pT = exp2_mix(sT * qk_scale - lse2[None, :], POLY)
    if MASK:
        if NSUB == 1:
            pT = tl.where(kn[:, None] <= (r // GP)[None, :], pT, 0.0)
        else:
            pT = tl.where(kn[:, None] <= t[None, :], pT, 0.0)
    dv = mm_acc(pT.to(do.dtype), do, dv, PREC)
    if not DP_FIRST:
        dpT = mm_acc(v, tl.trans(do), None, PREC)
    dsT = (pT * (dpT - delta[None, :])).to(q.dtype)
    dk = mm_acc(dsT, q, dk, PREC)
    return dk, dv


@triton.jit
def chunk_item(u, NCH, TPC: tl.constexpr):
    """(tile, chunk, chunks of the tile, item of its first chunk) of key-major item u when each
    key tile's rows are cut at every CHUNK = TPC key tiles' width of positions: chunk c holds the
    rows of positions [c*CHUNK, (c+1)*CHUNK), so tile i has chunks i // TPC ... NCH - 1. Items run
    tile by tile, the heaviest tiles first (group k: TPC tiles of NCH - k chunks each)."""
    zero = u * 0
    tile, c, nc, first, base = zero, zero, zero + 1, zero, zero
    for k in range(0, NCH):
        per = NCH - k
        inside = (u >= base) & (u < base + TPC * per)
        off = u - base
        tile = tl.where(inside, k * TPC + off // per, tile)
        c = tl.where(inside, k + off % per, c)
        nc = tl.where(inside, per, nc)
        first = tl.where(inside, base + (off // per) * per, first)
        base += TPC * per
    return tile, c, nc, first


@triton.jit
def store_kv(DK, DV, dk, dv, b, j, kn, T, Hk, sm_scale, D: tl.constexpr):
    ptr = ((b * T + kn).to(tl.int64) * Hk + j)[:, None] * D + tl.arange(0, D)[None, :]
    tl.store(DK + ptr, (dk * sm_scale).to(DK.dtype.element_ty), mask=(kn < T)[:, None])
    tl.store(DV + ptr, dv.to(DV.dtype.element_ty), mask=(kn < T)[:, None])


@triton.jit
def depth_item(Q, DO, KD, VD, DQ, DKD, DVD, LSE2, DELTA, qdesc, dodesc, kddesc, vddesc, dkddesc, dvddesc, b, j, bh,
               t0, T, L, G, Hk, RP, qk_scale, sm_scale, GP: tl.constexpr, BM: tl.constexpr, D: tl.constexpr,
               S: tl.constexpr, BL: tl.constexpr, USE_DESC: tl.constexpr, PREC: tl.constexpr,
               DEPTH_STAGES: tl.constexpr, DEPTH_GRAD: tl.constexpr, DEPTH_ACC: tl.constexpr = False,
               STRIDED: tl.constexpr = False, DST=None):
    """The depth part of the BM folded rows from position t0 as an item of the key-major grid
    (`depth_part`; the rows' lse2 and delta from the dq pass's buffers): dk_depth, dv_depth stored
    (added with DEPTH_ACC), its dq share added to the dq the depth-less dq pass stored (the rows are
    this item's alone)."""
    q = rows_tile(Q, qdesc, b, j, 0, t0, T, G, G * Hk, GP, BM, D, USE_DESC)
    do = rows_tile(DO, dodesc, b, j, 0, t0, T, G, G * Hk, GP, BM, D, USE_DESC)
    r = t0 * GP + tl.arange(0, BM)
    lse2 = tl.load(LSE2 + bh * RP + r)
    delta = tl.load(DELTA + bh * RP + r)
    dq = depth_part(q, do, lse2, delta, tl.zeros([BM, D], tl.float32), KD, VD, DKD, DVD, kddesc, vddesc, dkddesc,
                    dvddesc, b, j, t0, T, L, Hk, qk_scale, sm_scale, GP, BM, D, S, BL, USE_DESC, PREC, DEPTH_STAGES,
                    DEPTH_GRAD, DEPTH_ACC, STRIDED, DST)
    optr, ok = rows_ptr(b, j, 0, r, T, G, G * Hk, GP, D)
    old = tl.load(DQ + optr, mask=ok, other=0.0).to(tl.float32)
    tl.store(DQ + optr, (old + dq * sm_scale).to(DQ.dtype.element_ty), mask=ok)


@triton.jit
def kv_item(Q, K, V, DO, O, LSE, LSE2, DELTA, DK, DV, WS, CNT, qdesc, dodesc, odesc, qk_scale, sm_scale, B, T, G, Hk,
            RP, NCH, N_ITEMS, N_TILES, bh, b, j, u, sub, GP: tl.constexpr, NSUB: tl.constexpr, BM: tl.constexpr,
            BN: tl.constexpr, D: tl.constexpr, USE_DESC: tl.constexpr, PREC: tl.constexpr, STATS: tl.constexpr,
            CHUNK: tl.constexpr, DP_FIRST: tl.constexpr, POLY: tl.constexpr, HOST_DESC: tl.constexpr):
    """Key item u of the key-major grid (`_kv_kernel`): one key tile, or one chunk of its rows, for
    the heads of sub-group `sub` (of NSUB)."""
    P: tl.constexpr = BM // (GP // NSUB)
    NDIAG: tl.constexpr = (BN + P - 1) // P
    if CHUNK == 0:
        tile, c, nc, first = u, 0, 1, u
    else:
        tile, c, nc, first = chunk_item(u, NCH, CHUNK // BN)
    n0 = tile * BN
    kdesc = None
    vdesc = None
    if HOST_DESC:
        kdesc, vdesc = K, V
    elif USE_DESC:
        kdesc = keys_desc(K, B, T, Hk, BN, D)
        vdesc = keys_desc(V, B, T, Hk, BN, D)
    k = keys_tile(K, kdesc, b, j, n0, T, Hk, BN, D, USE_DESC)
    v = keys_tile(V, vdesc, b, j, n0, T, Hk, BN, D, USE_DESC)
    kn = n0 + tl.arange(0, BN)
    dk = tl.zeros([BN, D], tl.float32)
    dv = tl.zeros([BN, D], tl.float32)
    diag_end = tl.minimum(n0 + NDIAG * P, T)
    if CHUNK == 0:
        diag_hi = diag_end
        lo = diag_end
        hi = T
    else:  # the tile's first chunk takes the diagonal steps; a step belongs to the chunk of its first row
        diag_hi = tl.where(u == first, diag_end, n0)
        lo = diag_end + tl.cdiv(tl.maximum(c * CHUNK - diag_end, 0), P) * P
        hi = tl.minimum((c + 1) * CHUNK, T)
    for t0 in range(n0, diag_hi, P):  # positions whose rows see only part of the tile
        dk, dv = _kv_step(k, v, dk, dv, kn, t0, sub, Q, DO, O, LSE, qdesc, dodesc, odesc, LSE2, DELTA, b, j, bh, T,
                          G, Hk, RP, qk_scale, GP, NSUB, BM, D, True, USE_DESC, PREC, STATS, DP_FIRST, POLY)
    for t0 in tl.range(lo, hi, P):
        dk, dv = _kv_step(k, v, dk, dv, kn, t0, sub, Q, DO, O, LSE, qdesc, dodesc, odesc, LSE2, DELTA, b, j, bh, T,
                          G, Hk, RP, qk_scale, GP, NSUB, BM, D, False, USE_DESC, PREC, STATS, DP_FIRST, POLY)
    if CHUNK == 0 and NSUB == 1:
        store_kv(DK, DV, dk, dv, b, j, kn, T, Hk, sm_scale, D)
    else:  # partials: nc chunks x NSUB sub-groups of the tile, in WS (B*Hk*NSUB, N_ITEMS, 2, BN, D)
        if nc * NSUB == 1:
            store_kv(DK, DV, dk, dv, b, j, kn, T, Hk, sm_scale, D)
        else:
            cell = tl.arange(0, BN)[:, None] * D + tl.arange(0, D)[None, :]
            if NSUB == 1:
                slot = (bh.to(tl.int64) * N_ITEMS + u) * (2 * BN * D)
            else:
                slot = ((bh * NSUB + sub).to(tl.int64) * N_ITEMS + u) * (2 * BN * D)
            tl.store(WS + slot + cell, dk)
            tl.store(WS + slot + BN * D + cell, dv)
            # every thread's stores before the barrier, the barrier before thread 0's release: the
            # program that acquires the last arrival sees all chunks (as decode's fused combine)
            tl.debug_barrier()
            cidx = bh * N_TILES + tile
            arrived = tl.atomic_add(CNT + cidx, 1, sem="acq_rel", scope="gpu")
            if arrived == nc * NSUB - 1:
                tl.debug_barrier()
                dk = tl.zeros([BN, D], tl.float32)
                dv = tl.zeros([BN, D], tl.float32)
                if NSUB == 1:
                    for i in range(0, nc):
                        s_i = (bh.to(tl.int64) * N_ITEMS + first + i) * (2 * BN * D)
                        dk += tl.load(WS + s_i + cell)
                        dv += tl.load(WS + s_i + BN * D + cell)
                else:
                    for ss in range(0, NSUB):
                        for i in range(0, nc):
                            s_i = ((bh * NSUB + ss).to(tl.int64) * N_ITEMS + first + i) * (2 * BN * D)
                            dk += tl.load(WS + s_i + cell)
                            dv += tl.load(WS + s_i + BN * D + cell)
                store_kv(DK, DV, dk, dv, b, j, kn, T, Hk, sm_scale, D)
                tl.atomic_xchg(CNT + cidx, 0, sem="relaxed", scope="gpu")


@triton.jit
def dq_step(q, do, lse2, delta, t, dq, K, V, kdesc, vdesc, b, j, n0, T, Hk, qk_scale, BN: tl.constexpr,
            D: tl.constexpr, MASK: tl.constexpr, USE_DESC: tl.constexpr, PREC: tl.constexpr,
            DP_FIRST: tl.constexpr, POLY: tl.constexpr):
    """dq (unscaled) += the share of the BN sequence keys from n0 (DP_FIRST, POLY as in `_kv_step`)."""
    k = keys_tile(K, kdesc, b, j, n0, T, Hk, BN, D, USE_DESC)
    v = keys_tile(V, vdesc, b, j, n0, T, Hk, BN, D, USE_DESC)
    s = mm_acc(q, tl.trans(k), None, PREC)
    if DP_FIRST:
        dp = mm_acc(do, tl.trans(v), None, PREC)
    p = exp2_mix(s * qk_scale - lse2[:, None], POLY)
    if MASK:
        p = tl.where((n0 + tl.arange(0, BN))[None, :] <= t[:, None], p, 0.0)
    if not DP_FIRST:
        dp = mm_acc(do, tl.trans(v), None, PREC)
    return mm_acc((p * (dp - delta[:, None])).to(k.dtype), k, dq, PREC)


@triton.jit
def dq_rows(q, do, lse2, delta, t, t0, K, V, kdesc, vdesc, b, j, T, Hk, qk_scale, NPOS: tl.constexpr,
            BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, USE_DESC: tl.constexpr, PREC: tl.constexpr,
            DP_FIRST: tl.constexpr, POLY: tl.constexpr):
    """dq (unscaled) of BM rows at positions t (NPOS positions from t0) over the sequence keys: the
    key tiles wholly below t0 unmasked, then the diagonal ones."""
    dq = tl.zeros([BM, D], tl.float32)
    n_full = (t0 // BN) * BN
    for n0 in tl.range(0, n_full, BN):
        dq = dq_step(q, do, lse2, delta, t, dq, K, V, kdesc, vdesc, b, j, n0, T, Hk, qk_scale, BN, D,
                     False, USE_DESC, PREC, DP_FIRST, POLY)
    for n0 in range(n_full, tl.minimum(t0 + NPOS, T), BN):
        dq = dq_step(q, do, lse2, delta, t, dq, K, V, kdesc, vdesc, b, j, n0, T, Hk, qk_scale, BN, D,
                     True, USE_DESC, PREC, DP_FIRST, POLY)
    return dq


@triton.jit
def depth_part(q, do, lse2, delta, dq, KD, VD, DKD, DVD, kddesc, vddesc, dkddesc, dvddesc, b, j, t0, T, L, Hk,
               qk_scale, sm_scale, GP: tl.constexpr, BM: tl.constexpr, D: tl.constexpr, S: tl.constexpr,
               BL: tl.constexpr, USE_DESC: tl.constexpr, PREC: tl.constexpr, DEPTH_STAGES: tl.constexpr,
               DEPTH_GRAD: tl.constexpr, DEPTH_ACC: tl.constexpr = False, STRIDED: tl.constexpr = False,
               DST=None):
    """dq += the depth share of one row block; with DEPTH_GRAD, dk_depth and dv_depth of its P
    positions are stored (nothing is written to DKD, DVD without it). DEPTH_ACC: DKD, DVD hold a
    caller's gradients (slices of a model's depth gradient buffer) and this block's are added to
    them: load, add in fp32, one rounding, store. A depth entry is read by the G rows of its own
    position only, so this program is its one owner (no atomics). STRIDED: DST = (sb, st, sl, gb,
    gt, gl), the (batch, position, slot) element strides of KD, VD and of DKD, DVD (head stride D,
    unit last), for the pointer loads (the descriptors were built with them by the caller); else
    all four are contiguous (B,T,L,Hk,D)."""
    P: tl.constexpr = BM // GP
    NB: tl.constexpr = P // S
    R: tl.constexpr = S * GP
    C: tl.constexpr = S * BL
    q3 = tl.reshape(q, (NB, R, D))
    do3 = tl.reshape(do, (NB, R, D))
    lse3 = tl.reshape(lse2, (NB, R, 1))
    delta3 = tl.reshape(delta, (NB, R, 1))
    cc = tl.arange(0, C)[None, None, :]
    same_pos = (tl.arange(0, R)[None, :, None] // GP) == (cc // BL)
    pos = t0 + tl.arange(0, P)
    for l0 in tl.range(0, L, BL, num_stages=DEPTH_STAGES):
        ll = l0 + tl.arange(0, BL)
        if STRIDED:
            sb, st, sl, gb, gt, gl = DST
            row = b.to(tl.int64) * sb + pos.to(tl.int64) * st
            inner = (ll * sl)[None, :, None] + j * D + tl.arange(0, D)[None, None, :]
            ptr = row[:, None, None] + inner
            grow = b.to(tl.int64) * gb + pos.to(tl.int64) * gt
            gptr = grow[:, None, None] + (ll * gl)[None, :, None] + j * D + tl.arange(0, D)[None, None, :]
        else:
            ptr = ((((b * T + pos).to(tl.int64) * L)[:, None, None] + ll[None, :, None]) * Hk + j) * D \
                + tl.arange(0, D)[None, None, :]
            gptr = ptr
        ok = (pos < T)[:, None, None] & (ll < L)[None, :, None]
        if USE_DESC:
            kd = tl.reshape(kddesc.load([b, t0, l0, j * D]), (NB, C, D))
            vd = tl.reshape(vddesc.load([b, t0, l0, j * D]), (NB, C, D))
        else:
            kd = tl.reshape(tl.load(KD + ptr, mask=ok, other=0.0), (NB, C, D))
            vd = tl.reshape(tl.load(VD + ptr, mask=ok, other=0.0), (NB, C, D))
        own = same_pos & ((l0 + cc % BL) < L)
        p3 = tl.where(own, tl.math.exp2(mm(q3, tl.trans(kd, 0, 2, 1), PREC) * qk_scale - lse3), 0.0)
        ds3 = p3 * (mm(do3, tl.trans(vd, 0, 2, 1), PREC) - delta3)
        dq += tl.reshape(mm(ds3.to(kd.dtype), kd, PREC), (BM, D))
        if DEPTH_GRAD:  # batched (mma.sync) products: these operand transposes are GPU-tested
            if DEPTH_ACC:  # the caller's gradients + this block's, in fp32, rounded once
                dvd = mm(tl.trans(p3.to(do.dtype), 0, 2, 1), do3, PREC)
                dkd = mm(tl.trans(ds3.to(q.dtype), 0, 2, 1), q3, PREC) * sm_scale
                if USE_DESC:  # out-of-range entries load as zeros and are not stored
                    dkd += tl.reshape(dkddesc.load([b, t0, l0, j * D]), (NB, C, D)).to(tl.float32)
                    dvd += tl.reshape(dvddesc.load([b, t0, l0, j * D]), (NB, C, D)).to(tl.float32)
                else:
                    dkd += tl.reshape(tl.load(DKD + gptr, mask=ok, other=0.0), (NB, C, D)).to(tl.float32)
                    dvd += tl.reshape(tl.load(DVD + gptr, mask=ok, other=0.0), (NB, C, D)).to(tl.float32)
                dkd = dkd.to(kd.dtype)  # the buffers have the depth K/V's dtype (`check_depth_grad_into`)
                dvd = dvd.to(kd.dtype)
            else:
                dvd = mm(tl.trans(p3.to(do.dtype), 0, 2, 1), do3, PREC).to(kd.dtype)
                dkd = (mm(tl.trans(ds3.to(q.dtype), 0, 2, 1), q3, PREC) * sm_scale).to(kd.dtype)
            if USE_DESC:
                dkddesc.store([b, t0, l0, j * D], tl.reshape(dkd, (1, P, BL, D)))
                dvddesc.store([b, t0, l0, j * D], tl.reshape(dvd, (1, P, BL, D)))
            else:
                tl.store(DKD + gptr, tl.reshape(dkd, (P, BL, D)), mask=ok)
                tl.store(DVD + gptr, tl.reshape(dvd, (P, BL, D)), mask=ok)
    return dq


@triton.jit
def dq_block(Q, K, V, KD, VD, O, DO, LSE, LSE2, DELTA, DQ, DKD, DVD, qk_scale, sm_scale, B, T, L, LD, G, Hk, RP, n_m,
             bh, i, GP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, TAIL: tl.constexpr, D: tl.constexpr,
             S: tl.constexpr, BL: tl.constexpr, DEPTH: tl.constexpr, DEPTH_GRAD: tl.constexpr, USE_DESC: tl.constexpr,
             PREC: tl.constexpr, DEPTH_STAGES: tl.constexpr, MIX: tl.constexpr, DP_FIRST: tl.constexpr,
             POLY: tl.constexpr, HOST_DESC: tl.constexpr, STATS_OUT: tl.constexpr, READY=None,
             RELEASE: tl.constexpr = False, DEPTH_ACC: tl.constexpr = False, STRIDED: tl.constexpr = False, DST=None):
    """Row block i of (batch, KV head) bh of the query-major pass (`kernel_bwd_tma._dq_kernel`, and
    the dq items of `_one_kernel`): with STATS_OUT the rows' lse2 and delta stored in the flat
    buffers for the key-major pass (block 0 also the TAIL rows after the last block), and with
    RELEASE then adds 1 to READY[bh] (release: the stores before it are seen by whoever reads the
    count with acquire, `_one_kernel`'s key-major items); dq from the
    sequence keys and (DEPTH) the depth keys with dk_depth, dv_depth (DEPTH_GRAD). Block i is the
    last but i, or (MIX) the last, the first, the last but one, ... HOST_DESC: Q, DO, K, V (and KD,
    VD with DEPTH; DKD, DVD with DEPTH_GRAD) are host-side descriptors. DEPTH_ACC, STRIDED, DST:
    `depth_part`'s (device-side descriptors then built with DST's strides, `depth_descs_at`)."""
    P: tl.constexpr = BM // GP
    if MIX:  # heavy and light blocks alternate: co-resident programs mix sequence math and depth bytes
        t0 = tl.where(i % 2 == 0, n_m - 1 - i // 2, i // 2) * P
    else:
        t0 = (n_m - 1 - i) * P
    b = bh // Hk
    j = bh % Hk
    qdesc, dodesc, kdesc, vdesc = None, None, None, None
    kddesc, vddesc, dkddesc, dvddesc = None, None, None, None
    if HOST_DESC:
        qdesc, dodesc, kdesc, vdesc = Q, DO, K, V
        if DEPTH:
            kddesc, vddesc = KD, VD
            if DEPTH_GRAD:
                dkddesc, dvddesc = DKD, DVD
    elif USE_DESC:
        qdesc = rows_desc(Q, B, T, G * Hk, P, GP, D)
        dodesc = rows_desc(DO, B, T, G * Hk, P, GP, D)
        kdesc = keys_desc(K, B, T, Hk, BN, D)
        vdesc = keys_desc(V, B, T, Hk, BN, D)
        if DEPTH:
            if STRIDED:
                kddesc, vddesc = depth_descs_at(KD, VD, B, T, LD, Hk, DST[0], DST[1], DST[2], P, BL, D)
                if DEPTH_GRAD:
                    dkddesc, dvddesc = depth_descs_at(DKD, DVD, B, T, LD, Hk, DST[3], DST[4], DST[5], P, BL, D)
            else:
                kddesc, vddesc = depth_descs(KD, VD, B, T, LD, Hk, P, BL, D)
                if DEPTH_GRAD:
                    dkddesc, dvddesc = depth_descs(DKD, DVD, B, T, LD, Hk, P, BL, D)
    q = rows_tile(Q, qdesc, b, j, 0, t0, T, G, G * Hk, GP, BM, D, USE_DESC)
    do = rows_tile(DO, dodesc, b, j, 0, t0, T, G, G * Hk, GP, BM, D, USE_DESC)
    r = t0 * GP + tl.arange(0, BM)
    t = r // GP
    optr, ok = rows_ptr(b, j, 0, r, T, G, G * Hk, GP, D)
    lse2, delta = row_stats(do, O, None, LSE, b, j, t0, T, G, Hk, GP, BM, D, False)  # o by pointers, as dq's store
    if STATS_OUT:
        tl.store(LSE2 + bh * RP + r, lse2)
        tl.store(DELTA + bh * RP + r, delta)
        if i == 0:  # the last block: the TAIL rows after it, read by the key-major pass's last steps
            rt = n_m * BM + tl.arange(0, TAIL)
            tl.store(LSE2 + bh * RP + rt, tl.full([TAIL], float("inf"), tl.float32))
            tl.store(DELTA + bh * RP + rt, tl.zeros([TAIL], tl.float32))
        if RELEASE:  # every thread's stores before the barrier, the barrier before the release
            tl.debug_barrier()
            tl.atomic_add(READY + bh, 1, sem="release", scope="gpu")
    dq = dq_rows(q, do, lse2, delta, t, t0, K, V, kdesc, vdesc, b, j, T, Hk, qk_scale, P, BM, BN, D, USE_DESC,
                 PREC, DP_FIRST, POLY)
    if DEPTH:
        dq = depth_part(q, do, lse2, delta, dq, KD, VD, DKD, DVD, kddesc, vddesc, dkddesc, dvddesc, b, j, t0, T, L,
                        Hk, qk_scale, sm_scale, GP, BM, D, S, BL, USE_DESC, PREC, DEPTH_STAGES, DEPTH_GRAD,
                        DEPTH_ACC, STRIDED, DST)
    tl.store(DQ + optr, (dq * sm_scale).to(DQ.dtype.element_ty), mask=ok)
