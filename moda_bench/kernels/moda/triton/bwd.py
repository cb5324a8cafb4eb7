"""Backward Triton kernels of the fused MoDA kernel (launched by `moda_bench.kernels.moda.triton.interface`).

`moda_bwd_delta_kernel`: delta = rowsum(o * do), where the query-major pass does not compute it
itself (DELTA_INLINE, when it runs before every pass that reads delta). `moda_bwd_q_kernel`: the
query-major pass, dq
from the sequence keys and (MODE BWDQ_FUSED) the depth keys with dk_depth, dv_depth; a depth
entry is read only by the rows of its own position, all inside one block, so no atomics.
`moda_bwd_kv_kernel`: the key-major pass, dk and dv per block of keys; with DEPTH its grid also
carries depth-only programs, and without KV it is the depth-only launch ("split", "stream").

DEPTH_GRAD (constexpr of both kernels, used wherever a depth part runs): False treats the depth
K/V as constants (detached): the depth part still reads k_depth, v_depth for its dq share, but
the dk_depth / dv_depth products and their stores are compiled out (DKD, DVD are then unused
and may alias anything).
"""
from __future__ import annotations

import triton
import triton.language as tl

from moda_bench.kernels.moda.triton.utils import depth_base, depth_tile, key_span, mm, row_ptrs


@triton.jit
def moda_bwd_delta_kernel(O, DO, DELTA, n_rows, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    """delta[row] = sum_d o[row, d] * do[row, d] over the flattened (B*T*Hq, d) view."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    ok = rows < n_rows
    o = tl.load(O + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    tl.store(DELTA + rows, tl.sum(o * do, 1), mask=ok)


@triton.jit
def _bwd_rows(Q, DO, LSE, DELTA, b, j, rows, T, G, sqb, sqt, sqh, sob, sot, soh, slb, slt, slh,
              GP: tl.constexpr, HEAD_DIM: tl.constexpr, O, DELTA_INLINE: tl.constexpr,
              qdesc=None, dodesc=None, r0=0, DESC: tl.constexpr = False):
    """Folded rows r = t*GP + g of KV head j: (q, do, lse * log2(e), delta, t, row_ok); padding
    rows (g >= G or t >= T) load zeros, so they add nothing to any gradient. DELTA_INLINE: delta
    = rowsum(o * do) is computed here from O (do's strides) and stored to DELTA for the passes
    that run after this one, instead of being loaded (no preprocessing launch). DESC: q and do
    come through tensor descriptors ([1, P, GP, d] boxes of (B, T, Hq, d); rows = r0 + arange,
    r0 a multiple of GP); a box's heads past G belong to the next KV head, so padding
    rows are zeroed after the load."""
    offs_d = tl.arange(0, HEAD_DIM)
    t = rows // GP
    g = rows % GP
    row_ok = (t < T) & (g < G)
    if DESC:
        BM: tl.constexpr = rows.shape[0]
        t0 = r0 // GP
        q = tl.reshape(qdesc.load([b, t0, j * G, 0]), (BM, HEAD_DIM))
        do = tl.reshape(dodesc.load([b, t0, j * G, 0]), (BM, HEAD_DIM))
        q = tl.where(row_ok[:, None], q, 0.0).to(q.dtype)
        do = tl.where(row_ok[:, None], do, 0.0).to(do.dtype)
    else:
        q = tl.load(row_ptrs(Q, b, j, rows, offs_d, G, sqb, sqt, sqh, GP), mask=row_ok[:, None], other=0.0)
        do = tl.load(row_ptrs(DO, b, j, rows, offs_d, G, sob, sot, soh, GP), mask=row_ok[:, None], other=0.0)
    lrow = b * slb + t * slt + (j * G + g) * slh
    lse2 = tl.load(LSE + lrow, mask=row_ok, other=0.0) * 1.4426950408889634
    if DELTA_INLINE:
        o = tl.load(row_ptrs(O, b, j, rows, offs_d, G, sob, sot, soh, GP), mask=row_ok[:, None], other=0.0)
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
        tl.store(DELTA + lrow, delta, mask=row_ok)
    else:
        delta = tl.load(DELTA + lrow, mask=row_ok, other=0.0)
    return q, do, lse2, delta, t, row_ok


@triton.jit
def _bwd_q_seq_step(q, do, lse2, delta, t, kbase, vbase, start_n, T, skt, svt, qk_scale,
                    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, PREC: tl.constexpr, MASK: tl.constexpr,
                    kdesc=None, vdesc=None, b=0, j=0, DESC: tl.constexpr = False):
    """dq contribution (unscaled) of one tile of BLOCK_N sequence keys. DESC: the tile comes as
    [BLOCK_N, d] boxes of the (B*T, Hk*d) views (keys past T belong to the next sequence or are
    zero-filled: masked on the diagonal tiles, the only ones that reach them)."""
    offs_d = tl.arange(0, HEAD_DIM)
    kn = start_n + tl.arange(0, BLOCK_N)
    if DESC:
        kT = tl.trans(kdesc.load([b * T + start_n, j * HEAD_DIM]))
        vT = tl.trans(vdesc.load([b * T + start_n, j * HEAD_DIM]))
    elif MASK:
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
def _bwd_depth_phase(q, do, lse2, delta, dq, KD, VD, DKD, DVD, dbase, gbase, t_lo, T, L, sdt, sdl, sgt, sgl,
                     qk_scale, sm_scale,
                     NB: tl.constexpr, S: tl.constexpr, R: tl.constexpr, GP: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_L: tl.constexpr, HEAD_DIM: tl.constexpr, PREC: tl.constexpr, DEPTH_STAGES: tl.constexpr,
                     DEPTH_GRAD: tl.constexpr, DEPTH_ACC: tl.constexpr):
    """Depth part of the backward for one block of rows: adds the depth keys' (unscaled) dq
    contribution to dq and, with DEPTH_GRAD, writes dk_depth, dv_depth of the block's positions
    (each depth entry is read by the rows of its own position only, so no other program touches
    it). Without DEPTH_GRAD only the dq share is computed: nothing is written to DKD, DVD.
    DEPTH_ACC: DKD, DVD already hold gradients (a caller's buffer), and this call's are added to
    them (load, add in float32, store: the entry's one owner, no atomics).
    KD, VD are read at dbase with strides (sdt, sdl); DKD, DVD written at gbase with (sgt, sgl): a
    strided depth slice (one model-wide buffer) is read in place, its gradients go to buffers of
    their own layout."""
    q3 = tl.reshape(q, (NB, R, HEAD_DIM))
    do3 = tl.reshape(do, (NB, R, HEAD_DIM))
    lse3 = tl.reshape(lse2, (NB, R, 1))
    delta3 = tl.reshape(delta, (NB, R, 1))
    dbase = dbase + depth_base(t_lo, sdt)
    gbase = gbase + depth_base(t_lo, sgt)
    for f0 in tl.range(0, S * L, BLOCK_L, num_stages=DEPTH_STAGES):
        offs, ld_ok, own = depth_tile(t_lo, f0, T, L, sdt, sdl, NB, S, R, GP, BLOCK_L, HEAD_DIM)
        kd = tl.load(KD + dbase + offs, mask=ld_ok, other=0.0)
        vd = tl.load(VD + dbase + offs, mask=ld_ok, other=0.0)
        s3 = mm(q3, tl.trans(kd, 0, 2, 1), PREC) * qk_scale
        p3 = tl.math.exp2(s3 - lse3)
        p3 = tl.where(own, p3, 0.0)
        dp3 = mm(do3, tl.trans(vd, 0, 2, 1), PREC)
        ds3 = p3 * (dp3 - delta3)
        dq += tl.reshape(mm(ds3.to(kd.dtype), kd, PREC), (BLOCK_M, HEAD_DIM))
        if DEPTH_GRAD:
            dvd = mm(tl.trans(p3.to(do.dtype), 0, 2, 1), do3, PREC)
            dkd = mm(tl.trans(ds3.to(q.dtype), 0, 2, 1), q3, PREC) * sm_scale
            goffs = depth_tile(t_lo, f0, T, L, sgt, sgl, NB, S, R, GP, BLOCK_L, HEAD_DIM)[0]
            if DEPTH_ACC:
                dkd += tl.load(DKD + gbase + goffs, mask=ld_ok, other=0.0).to(tl.float32)
                dvd += tl.load(DVD + gbase + goffs, mask=ld_ok, other=0.0).to(tl.float32)
            tl.store(DKD + gbase + goffs, dkd.to(DKD.dtype.element_ty), mask=ld_ok)
            tl.store(DVD + gbase + goffs, dvd.to(DVD.dtype.element_ty), mask=ld_ok)
    return dq


@triton.jit
def _bwd_q_program(pid_m, b, j, Q, K, V, KD, VD, DO, LSE, DELTA, DQ, DKD, DVD, qk_scale, sm_scale, T, L, G,
                   sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdl, sdh, sgb, sgt, sgl, sgh,
                   sob, sot, soh, slb, slt, slh,
                   GP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                   SEQ: tl.constexpr, DEPTH: tl.constexpr, ADD: tl.constexpr, S: tl.constexpr,
                   BLOCK_L: tl.constexpr, PREC: tl.constexpr, DEPTH_STAGES: tl.constexpr,
                   DEPTH_GRAD: tl.constexpr, O, DELTA_INLINE: tl.constexpr,
                   kdesc=None, vdesc=None, DESC: tl.constexpr = False, DEPTH_ACC: tl.constexpr = False):
    """Query-major work of one block of BLOCK_M folded rows: dq from the sequence keys (SEQ)
    and/or from the depth keys plus (DEPTH_GRAD) dk_depth, dv_depth (DEPTH). ADD adds the
    partial dq already in DQ (written by a depth-only program) to this one's. DELTA_INLINE:
    this block's delta is computed from O and stored (see `_bwd_rows`)."""
    P: tl.constexpr = BLOCK_M // GP
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    q, do, lse2, delta, t, row_ok = _bwd_rows(Q, DO, LSE, DELTA, b, j, rows, T, G, sqb, sqt, sqh, sob, sot, soh,
                                              slb, slt, slh, GP, HEAD_DIM, O, DELTA_INLINE)
    offs_d = tl.arange(0, HEAD_DIM)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    t_lo = pid_m * P
    if SEQ:
        kbase, vbase, n_full, t_end = key_span(K, V, b, j, skb, skh, svb, svh, t_lo, T, P, BLOCK_N)
        for start_n in range(0, n_full, BLOCK_N):
            dq += _bwd_q_seq_step(q, do, lse2, delta, t, kbase, vbase, start_n, T, skt, svt, qk_scale,
                                  BLOCK_N, HEAD_DIM, PREC, False, kdesc, vdesc, b, j, DESC)
        for start_n in range(n_full, t_end, BLOCK_N):
            dq += _bwd_q_seq_step(q, do, lse2, delta, t, kbase, vbase, start_n, T, skt, svt, qk_scale,
                                  BLOCK_N, HEAD_DIM, PREC, True, kdesc, vdesc, b, j, DESC)
    if DEPTH:
        dq = _bwd_depth_phase(q, do, lse2, delta, dq, KD, VD, DKD, DVD, b * sdb + j * sdh, b * sgb + j * sgh, t_lo,
                              T, L, sdt, sdl, sgt, sgl, qk_scale, sm_scale, P // S, S, S * GP, GP, BLOCK_M, BLOCK_L,
                              HEAD_DIM, PREC, DEPTH_STAGES, DEPTH_GRAD, DEPTH_ACC)
    dq_ptrs = row_ptrs(DQ, b, j, rows, offs_d, G, sqb, sqt, sqh, GP)
    dq = dq * sm_scale
    if ADD:
        dq += tl.load(dq_ptrs, mask=row_ok[:, None], other=0.0).to(tl.float32)
    tl.store(dq_ptrs, dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])


# Query-major kernel modes:
BWDQ_SEQ = 0    # sequence keys only (L = 0)
BWDQ_FUSED = 1  # sequence and depth keys, depth gradients written here
BWDQ_ADD = 2    # sequence keys, plus the depth dq partial already in DQ


@triton.jit(do_not_specialize=["T", "L", "B"])
def moda_bwd_q_kernel(
    Q, K, V, KD, VD, DO, LSE, DELTA, DQ, DKD, DVD, O,
    qk_scale, sm_scale, T, L, G, Hk, B,
    # strides (the layout every launch shares): q, k, v, depth k/v, depth gradients, do/o, lse/delta
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdl, sdh, sgb, sgt, sgl, sgh,
    sob, sot, soh, slb, slt, slh,
    GP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    MODE: tl.constexpr, S: tl.constexpr, BLOCK_L: tl.constexpr, PREC: tl.constexpr,
    DEPTH_STAGES: tl.constexpr, REVERSE: tl.constexpr, DEPTH_GRAD: tl.constexpr, DELTA_INLINE: tl.constexpr,
    DESC: tl.constexpr = False, DEPTH_ACC: tl.constexpr = False,
):
    """Query-major pass (MODE: one of BWDQ_*). DO/DQ share q's strides (sqb...), LSE/DELTA
    share (slb, slt, slh); KD, VD share one set of strides (sdb...; unit last stride: a strided
    depth slice is read in place), DKD, DVD another (sgb...).
    DEPTH_GRAD (BWDQ_FUSED only): write dk_depth, dv_depth; False skips them (detached depth).
    DEPTH_ACC: add them to what DKD, DVD hold (a caller's gradient buffer) instead of storing.
    DELTA_INLINE: compute delta = rowsum(o * do) from O (do's strides) and store it to DELTA for
    the key-major pass launched after this one; else DELTA holds it already (O unused).
    DESC: the sequence K/V tiles come through tensor descriptors ([BLOCK_N, d] boxes of the
    contiguous (B*T, Hk*d) views; TMA on Hopper)."""
    kdesc = None
    vdesc = None
    if DESC:
        kdesc = tl.make_tensor_descriptor(K, shape=[B * T, Hk * HEAD_DIM], strides=[Hk * HEAD_DIM, 1],
                                          block_shape=[BLOCK_N, HEAD_DIM])
        vdesc = tl.make_tensor_descriptor(V, shape=[B * T, Hk * HEAD_DIM], strides=[Hk * HEAD_DIM, 1],
                                          block_shape=[BLOCK_N, HEAD_DIM])
    pid0 = tl.program_id(0)
    pid_bh = tl.program_id(1)
    pid_m = (tl.num_programs(0) - 1 - pid0) if REVERSE else pid0
    _bwd_q_program(pid_m, pid_bh // Hk, pid_bh % Hk, Q, K, V, KD, VD, DO, LSE, DELTA, DQ, DKD, DVD,
                   qk_scale, sm_scale, T, L, G,
                   sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdl, sdh, sgb, sgt, sgl, sgh,
                   sob, sot, soh, slb, slt, slh, GP, BLOCK_M, BLOCK_N, HEAD_DIM, True, MODE == 1, MODE == 2, S, BLOCK_L,
                   PREC, DEPTH_STAGES, DEPTH_GRAD, O, DELTA_INLINE, kdesc, vdesc, DESC, DEPTH_ACC)


@triton.jit
def _bwd_kv_step(k, v, kn, r0, Q, DO, LSE, DELTA, b, j, T, G, qk_scale,
                 sqb, sqt, sqh, sob, sot, soh, slb, slt, slh,
                 GP: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, PREC: tl.constexpr,
                 MASK: tl.constexpr, qdesc=None, dodesc=None, DESC: tl.constexpr = False):
    """(dk (unscaled), dv) contributions of BLOCK_M folded query rows starting at r0 (DESC: q, do
    through descriptors, see `_bwd_rows`)."""
    rows = r0 + tl.arange(0, BLOCK_M)
    q, do, lse2, delta, t, row_ok = _bwd_rows(Q, DO, LSE, DELTA, b, j, rows, T, G, sqb, sqt, sqh, sob, sot, soh,
                                              slb, slt, slh, GP, HEAD_DIM, DO, False, qdesc, dodesc, r0, DESC)
    kq = mm(k, tl.trans(q), PREC) * qk_scale  # [BLOCK_N, BLOCK_M]
    pT = tl.math.exp2(kq - lse2[None, :])
    if MASK:
        pT = tl.where((kn[:, None] <= t[None, :]) & row_ok[None, :], pT, 0.0)
    dv = mm(pT.to(do.dtype), do, PREC)
    dpT = mm(v, tl.trans(do), PREC)
    dsT = pT * (dpT - delta[None, :])
    dk = mm(dsT.to(q.dtype), q, PREC)
    return dk, dv


@triton.jit
def _bwd_kv_program(pid_n, b, j, Q, K, V, DO, LSE, DELTA, DK, DV, qk_scale, sm_scale, T, G,
                    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sob, sot, soh, slb, slt, slh,
                    GP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                    PREC: tl.constexpr, qdesc=None, dodesc=None, DESC: tl.constexpr = False):
    """dk, dv of BLOCK_N keys, looping over the folded query rows that see them (DESC: their q, do
    through descriptors; BLOCK_M is then a multiple of GP)."""
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
                                  sqb, sqt, sqh, sob, sot, soh, slb, slt, slh, GP, BLOCK_M, HEAD_DIM, PREC, True,
                                  qdesc, dodesc, DESC)
        dk += dk_i
        dv += dv_i
    r_un = n0 * GP + tl.cdiv(r_diag_end - n0 * GP, BLOCK_M) * BLOCK_M
    for r0 in range(r_un, r_end, BLOCK_M):
        dk_i, dv_i = _bwd_kv_step(k, v, kn, r0, Q, DO, LSE, DELTA, b, j, T, G, qk_scale,
                                  sqb, sqt, sqh, sob, sot, soh, slb, slt, slh, GP, BLOCK_M, HEAD_DIM, PREC, False,
                                  qdesc, dodesc, DESC)
        dk += dk_i
        dv += dv_i
    tl.store(DK + b * skb + kn[:, None] * skt + j * skh + offs_d[None, :], (dk * sm_scale).to(DK.dtype.element_ty),
             mask=kmask[:, None])
    tl.store(DV + b * svb + kn[:, None] * svt + j * svh + offs_d[None, :], dv.to(DV.dtype.element_ty),
             mask=kmask[:, None])


@triton.jit(do_not_specialize=["T", "L", "n_kv", "n_bh", "B"])
def moda_bwd_kv_kernel(
    Q, K, V, KD, VD, DO, LSE, DELTA, DK, DV, DQ, DKD, DVD,
    qk_scale, sm_scale, T, L, G, Hk, n_kv, n_bh, B,
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh,
    sdb, sdt, sdl, sdh, sgb, sgt, sgl, sgh,
    sob, sot, soh, slb, slt, slh,
    GP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    KV: tl.constexpr, DEPTH: tl.constexpr, DBLOCK_M: tl.constexpr, S: tl.constexpr, BLOCK_L: tl.constexpr,
    PREC: tl.constexpr, DEPTH_STAGES: tl.constexpr, DEPTH_GRAD: tl.constexpr, DESC: tl.constexpr = False,
    DEPTH_ACC: tl.constexpr = False,
):
    """Key-major pass. With KV, programs [0, n_kv) compute dk, dv (DK/DV share k's strides);
    with DEPTH the remaining programs each take DBLOCK_M folded rows and write their depth dq
    partial to DQ and, with DEPTH_GRAD, dk_depth, dv_depth (so the depth traffic overlaps the
    dk/dv compute). DESC (KV programs): q and do come through tensor descriptors ([1, P, GP, d]
    boxes of the contiguous (B, T, Hq, d) tensors; BLOCK_M a multiple of GP). DEPTH_ACC: the
    depth programs add dk_depth, dv_depth to what DKD, DVD hold (a caller's gradient buffer)."""
    qdesc = None
    dodesc = None
    if DESC:
        Hq = G * Hk
        qdesc = tl.make_tensor_descriptor(Q, shape=[B, T, Hq, HEAD_DIM],
                                          strides=[T.to(tl.int64) * Hq * HEAD_DIM, Hq * HEAD_DIM, HEAD_DIM, 1],
                                          block_shape=[1, BLOCK_M // GP, GP, HEAD_DIM])
        dodesc = tl.make_tensor_descriptor(DO, shape=[B, T, Hq, HEAD_DIM],
                                           strides=[T.to(tl.int64) * Hq * HEAD_DIM, Hq * HEAD_DIM, HEAD_DIM, 1],
                                           block_shape=[1, BLOCK_M // GP, GP, HEAD_DIM])
    if not KV:  # depth-only launch: 1-D grid, (b, KV head) fastest, as in the forward's; n_kv is
        # the number of work items here, and a grid smaller than that is persistent
        for w in range(tl.program_id(0), n_kv, tl.num_programs(0)):
            pid_bh = w % n_bh
            _bwd_q_program(w // n_bh, pid_bh // Hk, pid_bh % Hk, Q, K, V, KD, VD, DO, LSE, DELTA, DQ, DKD, DVD,
                           qk_scale, sm_scale, T, L, G, sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdl,
                           sdh, sgb, sgt, sgl, sgh, sob, sot, soh, slb, slt, slh, GP, DBLOCK_M, BLOCK_N, HEAD_DIM,
                           False, True, False, S, BLOCK_L, PREC, DEPTH_STAGES, DEPTH_GRAD, DO, False,
                           DEPTH_ACC=DEPTH_ACC)
    else:
        pid0 = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = pid_bh // Hk
        j = pid_bh % Hk
        if DEPTH:
            if pid0 < n_kv:
                _bwd_kv_program(pid0, b, j, Q, K, V, DO, LSE, DELTA, DK, DV, qk_scale, sm_scale, T, G,
                                sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sob, sot, soh, slb, slt, slh,
                                GP, BLOCK_M, BLOCK_N, HEAD_DIM, PREC, qdesc, dodesc, DESC)
            else:
                _bwd_q_program(pid0 - n_kv, b, j, Q, K, V, KD, VD, DO, LSE, DELTA, DQ, DKD, DVD, qk_scale, sm_scale,
                               T, L, G, sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdl, sdh,
                               sgb, sgt, sgl, sgh, sob, sot, soh, slb, slt, slh, GP, DBLOCK_M, BLOCK_N, HEAD_DIM,
                               False, True, False, S, BLOCK_L, PREC, DEPTH_STAGES, DEPTH_GRAD, DO, False,
                               DEPTH_ACC=DEPTH_ACC)
        else:
            _bwd_kv_program(pid0, b, j, Q, K, V, DO, LSE, DELTA, DK, DV, qk_scale, sm_scale, T, G,
                            sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sob, sot, soh, slb, slt, slh,
                            GP, BLOCK_M, BLOCK_N, HEAD_DIM, PREC, qdesc, dodesc, DESC)
