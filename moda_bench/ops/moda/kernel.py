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
  Sequence and depth logits share one online softmax; where the depth phase runs is a config
  choice (`fwd_depth`): fused after the sequence loop; "split" (default), a depth-only launch
  first whose normalised partial (o_d, lse_d) the sequence kernel loads as its starting state
  (m, l, acc) = (lse_d, 1, o_d), so the sequence loop is the L = 0 kernel's; or "overlap",
  depth-only programs inside the sequence grid and a log-sum-exp merge of the two partials.
* Backward: a query-major pass computes dq and a key-major pass dk, dv; delta = rowsum(o * do)
  comes from a small preprocessing kernel. The depth part (its dq share, dk_depth, dv_depth; a
  depth entry is read only by the rows of its own position, so no atomics) runs fused in the
  query-major pass, as its own launch ("split"), as extra programs of the key-major grid
  ("overlap"), or (`bwd_depth="stream"`, default) as its own launch on a second CUDA stream,
  concurrent with the key-major pass, so its memory traffic overlaps the dk/dv compute; the
  q-major pass adds the depth dq partial it finds in dq.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from moda_bench.ops.moda.triton_utils import dot_precision, mm
from moda_bench.ops.moda.config import DEPTH_MODES, MoDAConfig, auto_depth_sub, group_pad, resolve_config
from moda_bench.ops.moda.validate import MoDAShape, check_inputs

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
# Forward kernel modes (what a program of _moda_fwd_kernel computes):
FWD_SEQ = 0        # sequence phase only (L = 0)
FWD_FUSED = 1      # sequence then depth phase in one program, one online softmax
FWD_SEQ_INIT = 2   # sequence phase starting from the depth partial (o_d, lse_d) found in O, LSE
FWD_BOTH = 3       # programs [0, n_seq) do the sequence phase into O/LSE, the rest the depth phase
                   # into OD/LSED (two partials merged afterwards by _moda_merge_kernel)
FWD_DEPTH = 4      # depth phase only, into OD/LSED


@triton.jit
def _fwd_depth_phase(q, acc, m_i, l_i, KD, VD, dbase, t_lo, T, L, sdt, sdl, qk_scale,
                     NB: tl.constexpr, S: tl.constexpr, R: tl.constexpr, GP: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_L: tl.constexpr, HEAD_DIM: tl.constexpr, PREC: tl.constexpr, DEPTH_STAGES: tl.constexpr):
    """Fold the depth keys of the block's positions into (acc, m_i, l_i) with batched tiles."""
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
    return acc, m_i, l_i


@triton.jit
def _fwd_program(pid_m, b, j, Q, K, V, KD, VD, O, LSE, qk_scale, T, L, G,
                 sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdl, sdh,
                 sob, sot, soh, slb, slt, slh,
                 GP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                 SEQ: tl.constexpr, DEPTH: tl.constexpr, INIT: tl.constexpr, S: tl.constexpr,
                 BLOCK_L: tl.constexpr, PREC: tl.constexpr, DEPTH_STAGES: tl.constexpr):
    """One block of BLOCK_M folded rows: the sequence phase (SEQ), the depth phase (DEPTH), or
    both, writing the normalised output and lse of what it covered to O, LSE. INIT starts the
    online softmax from the partial (o, lse) already in O, LSE for these rows."""
    P: tl.constexpr = BLOCK_M // GP
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    t = rows // GP
    row_ok = (t < T) & ((rows % GP) < G)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(_row_ptrs(Q, b, j, rows, offs_d, G, sqb, sqt, sqh, GP), mask=row_ok[:, None], other=0.0)
    o_ptrs = _row_ptrs(O, b, j, rows, offs_d, G, sob, sot, soh, GP)
    l_ptrs = LSE + b * slb + t * slt + (j * G + rows % GP) * slh
    if INIT:
        # (m, l, acc) = (lse2, 1, o) reproduces the partial softmax state exactly
        acc = tl.load(o_ptrs, mask=row_ok[:, None], other=0.0).to(tl.float32)
        m_i = tl.load(l_ptrs, mask=row_ok, other=0.0) * 1.4426950408889634
        l_i = tl.full([BLOCK_M], 1.0, tl.float32)
    else:
        m_i = tl.full([BLOCK_M], NEG, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    t_lo = pid_m * P
    if SEQ:
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
    if DEPTH:
        acc, m_i, l_i = _fwd_depth_phase(q, acc, m_i, l_i, KD, VD, b * sdb + j * sdh, t_lo, T, L, sdt, sdl, qk_scale,
                                         P // S, S, S * GP, GP, BLOCK_M, BLOCK_L, HEAD_DIM, PREC, DEPTH_STAGES)
    acc = acc / l_i[:, None]
    lse = (m_i + tl.math.log2(l_i)) / 1.4426950408889634
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=row_ok[:, None])
    tl.store(l_ptrs, lse, mask=row_ok)


@triton.jit(do_not_specialize=["T", "L", "n_seq", "n_bh"])
def _moda_fwd_kernel(
    Q, K, V, KD, VD, O, LSE, OD, LSED,
    qk_scale, T, L, G, Hk, n_seq, n_bh,
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh,
    sdb, sdt, sdl, sdh,
    sob, sot, soh, slb, slt, slh,
    GP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    MODE: tl.constexpr, S: tl.constexpr, BLOCK_L: tl.constexpr, PREC: tl.constexpr,
    DEPTH_STAGES: tl.constexpr, REVERSE: tl.constexpr,
):
    """Grid (programs along rows, B*Hk); 1-D (B*Hk*programs) for FWD_DEPTH. MODE: one of FWD_* above. OD/LSED share O/LSE's strides.
    REVERSE visits row blocks last-first (the causally heaviest first)."""
    if MODE == 4:  # depth-only launch, 1-D grid with (b, KV head) fastest: programs in flight
        pid0 = tl.program_id(0) // n_bh  # read neighbouring heads of the same positions, whose
        pid_bh = tl.program_id(0) % n_bh  # depth entries are contiguous in memory
    else:
        pid0 = tl.program_id(0)
        pid_bh = tl.program_id(1)
    b = pid_bh // Hk
    j = pid_bh % Hk
    if MODE == 3:
        if pid0 < n_seq:
            pid_m = (n_seq - 1 - pid0) if REVERSE else pid0
            _fwd_program(pid_m, b, j, Q, K, V, KD, VD, O, LSE, qk_scale, T, L, G,
                         sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdl, sdh,
                         sob, sot, soh, slb, slt, slh, GP, BLOCK_M, BLOCK_N, HEAD_DIM,
                         True, False, False, S, BLOCK_L, PREC, DEPTH_STAGES)
        else:
            _fwd_program(pid0 - n_seq, b, j, Q, K, V, KD, VD, OD, LSED, qk_scale, T, L, G,
                         sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdl, sdh,
                         sob, sot, soh, slb, slt, slh, GP, BLOCK_M, BLOCK_N, HEAD_DIM,
                         False, True, False, S, BLOCK_L, PREC, DEPTH_STAGES)
    elif MODE == 4:
        _fwd_program(pid0, b, j, Q, K, V, KD, VD, OD, LSED, qk_scale, T, L, G,
                     sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdl, sdh,
                     sob, sot, soh, slb, slt, slh, GP, BLOCK_M, BLOCK_N, HEAD_DIM,
                     False, True, False, S, BLOCK_L, PREC, DEPTH_STAGES)
    else:
        pid_m = (tl.num_programs(0) - 1 - pid0) if REVERSE else pid0
        _fwd_program(pid_m, b, j, Q, K, V, KD, VD, O, LSE, qk_scale, T, L, G,
                     sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdl, sdh,
                     sob, sot, soh, slb, slt, slh, GP, BLOCK_M, BLOCK_N, HEAD_DIM,
                     True, MODE == 1, MODE == 2, S, BLOCK_L, PREC, DEPTH_STAGES)


@triton.jit
def _moda_merge_kernel(O, LSE, OD, LSED, n_rows, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    """O, LSE <- softmax merge of the two partials (O, LSE) and (OD, LSED) over the flattened
    (B*T*Hq, d) rows (all four contiguous)."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    ok = rows < n_rows
    l1 = tl.load(LSE + rows, mask=ok, other=0.0)
    l2 = tl.load(LSED + rows, mask=ok, other=0.0)
    m = tl.maximum(l1, l2)
    w1 = tl.exp(l1 - m)
    w2 = tl.exp(l2 - m)
    tot = w1 + w2
    o1 = tl.load(O + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    o2 = tl.load(OD + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    o = (o1 * w1[:, None] + o2 * w2[:, None]) / tot[:, None]
    tl.store(O + rows[:, None] * HEAD_DIM + offs_d[None, :], o.to(O.dtype.element_ty), mask=ok[:, None])
    tl.store(LSE + rows, m + tl.log(tot), mask=ok)


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
def _bwd_depth_phase(q, do, lse2, delta, dq, KD, VD, DKD, DVD, dbase, t_lo, T, L, sdt, sdl, qk_scale, sm_scale,
                     NB: tl.constexpr, S: tl.constexpr, R: tl.constexpr, GP: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_L: tl.constexpr, HEAD_DIM: tl.constexpr, PREC: tl.constexpr, DEPTH_STAGES: tl.constexpr):
    """Depth part of the backward for one block of rows: adds the depth keys' (unscaled) dq
    contribution to dq and writes dk_depth, dv_depth of the block's positions (each depth entry
    is read by the rows of its own position only, so no other program touches it)."""
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
    return dq


@triton.jit
def _bwd_q_program(pid_m, b, j, Q, K, V, KD, VD, DO, LSE, DELTA, DQ, DKD, DVD, qk_scale, sm_scale, T, L, G,
                   sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdl, sdh,
                   sob, sot, soh, slb, slt, slh,
                   GP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                   SEQ: tl.constexpr, DEPTH: tl.constexpr, ADD: tl.constexpr, S: tl.constexpr,
                   BLOCK_L: tl.constexpr, PREC: tl.constexpr, DEPTH_STAGES: tl.constexpr):
    """Query-major work of one block of BLOCK_M folded rows: dq from the sequence keys (SEQ)
    and/or from the depth keys plus dk_depth, dv_depth (DEPTH). ADD adds the partial dq
    already in DQ (written by a depth-only program) to this one's."""
    P: tl.constexpr = BLOCK_M // GP
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    q, do, lse2, delta, t, row_ok = _bwd_rows(Q, DO, LSE, DELTA, b, j, rows, T, G, sqb, sqt, sqh, sob, sot, soh,
                                              slb, slt, slh, GP, HEAD_DIM)
    offs_d = tl.arange(0, HEAD_DIM)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    t_lo = pid_m * P
    if SEQ:
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
    if DEPTH:
        dq = _bwd_depth_phase(q, do, lse2, delta, dq, KD, VD, DKD, DVD, b * sdb + j * sdh, t_lo, T, L, sdt, sdl,
                              qk_scale, sm_scale, P // S, S, S * GP, GP, BLOCK_M, BLOCK_L, HEAD_DIM, PREC,
                              DEPTH_STAGES)
    dq_ptrs = _row_ptrs(DQ, b, j, rows, offs_d, G, sqb, sqt, sqh, GP)
    dq = dq * sm_scale
    if ADD:
        dq += tl.load(dq_ptrs, mask=row_ok[:, None], other=0.0).to(tl.float32)
    tl.store(dq_ptrs, dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])


# Query-major kernel modes:
BWDQ_SEQ = 0    # sequence keys only (L = 0)
BWDQ_FUSED = 1  # sequence and depth keys, depth gradients written here
BWDQ_ADD = 2    # sequence keys, plus the depth dq partial already in DQ


@triton.jit(do_not_specialize=["T", "L"])
def _moda_bwd_q_kernel(
    Q, K, V, KD, VD, DO, LSE, DELTA, DQ, DKD, DVD,
    qk_scale, sm_scale, T, L, G, Hk,
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh,
    sdb, sdt, sdl, sdh,
    sob, sot, soh, slb, slt, slh,
    GP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    MODE: tl.constexpr, S: tl.constexpr, BLOCK_L: tl.constexpr, PREC: tl.constexpr,
    DEPTH_STAGES: tl.constexpr, REVERSE: tl.constexpr,
):
    """Query-major pass (MODE: one of BWDQ_*). DO/DQ share q's strides (sqb...), LSE/DELTA
    share (slb, slt, slh); KD, VD, DKD, DVD are contiguous with one set of strides (sdb...)."""
    pid0 = tl.program_id(0)
    pid_bh = tl.program_id(1)
    pid_m = (tl.num_programs(0) - 1 - pid0) if REVERSE else pid0
    _bwd_q_program(pid_m, pid_bh // Hk, pid_bh % Hk, Q, K, V, KD, VD, DO, LSE, DELTA, DQ, DKD, DVD,
                   qk_scale, sm_scale, T, L, G,
                   sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdl, sdh, sob, sot, soh, slb, slt, slh,
                   GP, BLOCK_M, BLOCK_N, HEAD_DIM, True, MODE == 1, MODE == 2, S, BLOCK_L, PREC, DEPTH_STAGES)


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


@triton.jit
def _bwd_kv_program(pid_n, b, j, Q, K, V, DO, LSE, DELTA, DK, DV, qk_scale, sm_scale, T, G,
                    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sob, sot, soh, slb, slt, slh,
                    GP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                    PREC: tl.constexpr):
    """dk, dv of BLOCK_N keys, looping over the folded query rows that see them."""
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


@triton.jit(do_not_specialize=["T", "L", "n_kv", "n_bh"])
def _moda_bwd_kv_kernel(
    Q, K, V, KD, VD, DO, LSE, DELTA, DK, DV, DQ, DKD, DVD,
    qk_scale, sm_scale, T, L, G, Hk, n_kv, n_bh,
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh,
    sdb, sdt, sdl, sdh,
    sob, sot, soh, slb, slt, slh,
    GP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    KV: tl.constexpr, DEPTH: tl.constexpr, DBLOCK_M: tl.constexpr, S: tl.constexpr, BLOCK_L: tl.constexpr,
    PREC: tl.constexpr, DEPTH_STAGES: tl.constexpr,
):
    """Key-major pass. With KV, programs [0, n_kv) compute dk, dv (DK/DV share k's strides);
    with DEPTH the remaining programs each take DBLOCK_M folded rows and write their depth dq
    partial to DQ and dk_depth, dv_depth (so the depth traffic overlaps the dk/dv compute)."""
    if KV:
        pid0 = tl.program_id(0)
        pid_bh = tl.program_id(1)
    else:  # depth-only launch: 1-D grid, (b, KV head) fastest, as in the forward's
        pid0 = tl.program_id(0) // n_bh
        pid_bh = tl.program_id(0) % n_bh
    b = pid_bh // Hk
    j = pid_bh % Hk
    if KV and DEPTH:
        if pid0 < n_kv:
            _bwd_kv_program(pid0, b, j, Q, K, V, DO, LSE, DELTA, DK, DV, qk_scale, sm_scale, T, G,
                            sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sob, sot, soh, slb, slt, slh,
                            GP, BLOCK_M, BLOCK_N, HEAD_DIM, PREC)
        else:
            _bwd_q_program(pid0 - n_kv, b, j, Q, K, V, KD, VD, DO, LSE, DELTA, DQ, DKD, DVD, qk_scale, sm_scale,
                           T, L, G, sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdl, sdh,
                           sob, sot, soh, slb, slt, slh, GP, DBLOCK_M, BLOCK_N, HEAD_DIM,
                           False, True, False, S, BLOCK_L, PREC, DEPTH_STAGES)
    elif KV:
        _bwd_kv_program(pid0, b, j, Q, K, V, DO, LSE, DELTA, DK, DV, qk_scale, sm_scale, T, G,
                        sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sob, sot, soh, slb, slt, slh,
                        GP, BLOCK_M, BLOCK_N, HEAD_DIM, PREC)
    else:
        _bwd_q_program(pid0, b, j, Q, K, V, KD, VD, DO, LSE, DELTA, DQ, DKD, DVD, qk_scale, sm_scale,
                       T, L, G, sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdl, sdh,
                       sob, sot, soh, slb, slt, slh, GP, DBLOCK_M, BLOCK_N, HEAD_DIM,
                       False, True, False, S, BLOCK_L, PREC, DEPTH_STAGES)


# --------------------------------------------------------------------------------------------
# launchers
# --------------------------------------------------------------------------------------------
_SIDE_STREAMS: dict = {}


def _side_stream(device):
    """A second CUDA stream per device for the depth kernels ("stream" placement); None off CUDA
    (the interpreter), where the launches simply run in order."""
    if device.type != "cuda":
        return None
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return _SIDE_STREAMS[device]


class _Concurrent:
    """Context: launches inside run on the side stream, ordered after the main stream's work up
    to the creation of this object (not up to entering it: main-stream launches made in
    between run concurrently with the side launches); `join()` makes the main stream wait for
    them."""

    def __init__(self, device):
        self.side = _side_stream(device)
        self.main = torch.cuda.current_stream(device) if self.side is not None else None
        if self.side is not None:
            self.ready = torch.cuda.Event()
            self.ready.record(self.main)

    def __enter__(self):
        if self.side is not None:
            self.side.wait_event(self.ready)
            self._ctx = torch.cuda.stream(self.side)
            self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        if self.side is not None:
            self._ctx.__exit__(*exc)
        return False

    def join(self):
        if self.side is not None:
            self.main.wait_stream(self.side)


def _run_beside(device, main_launch, side_launch, side_after: bool) -> None:
    """The "stream" placement: side_launch() on the side stream concurrently with main_launch()
    on the main stream, side_launch issued after main_launch when side_after (else before);
    on return the main stream waits for both."""
    conc = _Concurrent(device)
    if side_after:
        main_launch()
    with conc:
        side_launch()
    if not side_after:
        main_launch()
    conc.join()


def _depth_sub(cfg: MoDAConfig, G: int, block_m: int) -> int:
    s = cfg.depth_sub or auto_depth_sub(G, block_m)
    P = block_m // group_pad(G)
    if P % s != 0 or s * group_pad(G) < 16:
        raise ValueError(f"config depth_sub={cfg.depth_sub} invalid for G={G}, block_m={block_m}: need a divisor "
                         f"of {P} positions with depth_sub*{group_pad(G)} >= 16")
    return s


def _depth_sub_of(cfg: MoDAConfig, G: int, block_m: int) -> int:
    """Depth sub-tile positions for a depth-only program of block_m rows: cfg.depth_sub when it
    fits that block, else the automatic one."""
    P = block_m // group_pad(G)
    s = cfg.depth_sub
    if s and P % s == 0 and s * group_pad(G) >= 16:
        return s
    return auto_depth_sub(G, block_m)


def _fwd_depth_block(cfg: MoDAConfig) -> int:
    """Rows per program of the forward's depth phase."""
    return cfg.depth_block_m if cfg.fwd_depth in ("split", "stream") else cfg.block_m


def check_config(cfg: MoDAConfig, G: int) -> None:
    """Raise ValueError if cfg cannot run for group size G."""
    gp = group_pad(G)
    for name in ("block_m", "bwd_q_block_m", "depth_block_m", "bwd_depth_block_m"):
        bm = getattr(cfg, name)
        if bm < 16 or bm & (bm - 1) or bm % gp:
            raise ValueError(f"config {name}={bm} must be a power of two >= 16 and a multiple of GP={gp} (G={G})")
    for name in ("block_m", "bwd_q_block_m"):
        _depth_sub(cfg, G, getattr(cfg, name))
    for name in ("block_n", "bwd_q_block_n", "bwd_kv_block_m", "bwd_kv_block_n", "block_l", "bwd_block_l"):
        v = getattr(cfg, name)
        if v < 16 or v & (v - 1):
            raise ValueError(f"config {name}={v} must be a power of two >= 16")
    for name in ("fwd_depth", "bwd_depth"):
        if getattr(cfg, name) not in DEPTH_MODES:
            raise ValueError(f"config {name}={getattr(cfg, name)!r} must be one of {DEPTH_MODES}")


def depth_utilization(T: int, G: int, C: int, L: int, config: MoDAConfig | None = None) -> float:
    """Useful depth logits / depth logits this kernel computes in the forward (spec section 2).

    A sub-tile of S positions has S*GP rows and computes ceil(S*L/BLOCK_L)*BLOCK_L columns
    for each of them; S*G*L of those logits are needed.
    """
    if L == 0:
        return float("nan")
    cfg = config or MoDAConfig(block_m=max(C, group_pad(G)), fwd_depth="fused")
    bm = _fwd_depth_block(cfg)
    S = _depth_sub(cfg, G, bm) if cfg.fwd_depth == "fused" else _depth_sub_of(cfg, G, bm)
    cols = triton.cdiv(S * L, cfg.block_l) * cfg.block_l
    return (S * G * L) / (S * group_pad(G) * cols)


def _strides(q, k, v, kd, o, lse):
    """The stride arguments shared by every kernel launch, in kernel-signature order."""
    return (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), kd.stride(0), kd.stride(1), kd.stride(2), kd.stride(3),
            o.stride(0), o.stride(1), o.stride(2), lse.stride(0), lse.stride(1), lse.stride(2))


def _fwd(q, k, v, kd, vd, scale, shape: MoDAShape, cfg: MoDAConfig, depth_only: bool = False):
    """Forward launches; depth_only (split mode, for timing the depth kernel alone) stops after
    the depth-only launch and returns its partial (o_d, lse_d)."""
    B, T, Hq, d = q.shape
    Hk, G, L = shape.Hk, shape.G, shape.L
    gp = group_pad(G)
    o = torch.empty_like(q)
    lse = torch.empty((B, T, Hq), device=q.device, dtype=torch.float32)
    mode = cfg.fwd_depth if L > 0 else "none"
    kd_, vd_ = (kd, vd) if L > 0 else (k.unsqueeze(2), v.unsqueeze(2))
    st = _strides(q, k, v, kd_, o, lse)
    prec = dot_precision(q.dtype)
    n_seq = triton.cdiv(T * gp, cfg.block_m)
    seq_meta = dict(GP=gp, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HEAD_DIM=d, BLOCK_L=cfg.block_l, PREC=prec,
                    DEPTH_STAGES=cfg.depth_stages, REVERSE=cfg.reverse, num_warps=cfg.num_warps,
                    num_stages=cfg.num_stages)

    def launch(grid, od, lsed, n, MODE, S, **meta):
        _moda_fwd_kernel[grid](q, k, v, kd_, vd_, o, lse, od, lsed, scale * LOG2E, T, L, G, Hk, n, B * Hk, *st,
                               MODE=MODE, S=S, **meta)

    if mode == "none":
        launch((n_seq, B * Hk), o, lse, n_seq, FWD_SEQ, 1, **seq_meta)
    elif mode == "fused":
        launch((n_seq, B * Hk), o, lse, n_seq, FWD_FUSED, _depth_sub(cfg, G, cfg.block_m), **seq_meta)
    elif mode == "stream":  # depth-only kernel on a side stream, concurrent with the L=0 kernel
        od, lsed = torch.empty_like(o), torch.empty_like(lse)
        dbm = cfg.depth_block_m
        _run_beside(q.device,
                    lambda: launch((n_seq, B * Hk), o, lse, n_seq, FWD_SEQ, 1, **seq_meta),
                    lambda: launch((B * Hk * triton.cdiv(T * gp, dbm),), od, lsed, 0, FWD_DEPTH,
                                   _depth_sub_of(cfg, G, dbm),
                                   **dict(seq_meta, BLOCK_M=dbm, num_warps=cfg.depth_warps, num_stages=1)),
                    cfg.depth_after)
        n_rows = B * T * Hq
        _moda_merge_kernel[(triton.cdiv(n_rows, 64),)](o, lse, od, lsed, n_rows, HEAD_DIM=d, BLOCK=64)
    elif mode == "split":
        dbm = cfg.depth_block_m
        launch((B * Hk * triton.cdiv(T * gp, dbm),), o, lse, 0, FWD_DEPTH, _depth_sub_of(cfg, G, dbm),
               **dict(seq_meta, BLOCK_M=dbm, num_warps=cfg.depth_warps, num_stages=1))
        if depth_only:
            return o, lse
        launch((n_seq, B * Hk), o, lse, n_seq, FWD_SEQ_INIT, 1, **seq_meta)
    else:  # overlap
        od, lsed = torch.empty_like(o), torch.empty_like(lse)
        launch((2 * n_seq, B * Hk), od, lsed, n_seq, FWD_BOTH, _depth_sub_of(cfg, G, cfg.block_m), **seq_meta)
        n_rows = B * T * Hq
        _moda_merge_kernel[(triton.cdiv(n_rows, 64),)](o, lse, od, lsed, n_rows, HEAD_DIM=d, BLOCK=64)
    return o, lse


def _bwd(do, q, k, v, kd, vd, o, lse, scale, shape: MoDAShape, cfg: MoDAConfig, depth_only: bool = False):
    """Backward launches; depth_only (split mode, for timing) runs the depth-only launch alone
    (delta left uninitialised) and returns (dq partial, None, None, dkd, dvd)."""
    B, T, Hq, d = q.shape
    Hk, G, L = shape.Hk, shape.G, shape.L
    gp = group_pad(G)
    do = do.contiguous()
    delta = torch.empty_like(lse)
    n_rows = B * T * Hq
    if not depth_only:
        _moda_bwd_delta_kernel[(triton.cdiv(n_rows, 128),)](o, do, delta, n_rows, HEAD_DIM=d, BLOCK=128)
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    mode = cfg.bwd_depth if L > 0 else "none"
    if L > 0:
        dkd = torch.empty_like(kd)
        dvd = torch.empty_like(vd)
        kd_, vd_, dkd_, dvd_ = kd, vd, dkd, dvd
    else:
        dkd = dvd = None
        kd_, vd_ = k.unsqueeze(2), v.unsqueeze(2)
        dkd_, dvd_ = kd_, vd_  # never written (no depth work)
    st = _strides(q, k, v, kd_, do, lse)
    prec = dot_precision(q.dtype)
    args = (scale * LOG2E, scale, T, L, G, Hk)

    def kv_launch(KV, DEPTH, **meta):
        n_kv = triton.cdiv(T, cfg.bwd_kv_block_n) if KV else 0
        dbm = cfg.bwd_depth_block_m
        n_d = triton.cdiv(T * gp, dbm) if DEPTH else 0
        grid = (n_kv + n_d, B * Hk) if KV else (B * Hk * n_d,)
        _moda_bwd_kv_kernel[grid](
            q, k, v, kd_, vd_, do, lse, delta, dk, dv, dq, dkd_, dvd_, *args, n_kv, B * Hk, *st,
            GP=gp, BLOCK_M=cfg.bwd_kv_block_m, BLOCK_N=cfg.bwd_kv_block_n, HEAD_DIM=d, KV=KV, DEPTH=DEPTH,
            DBLOCK_M=dbm, S=_depth_sub_of(cfg, G, dbm), BLOCK_L=cfg.bwd_block_l, PREC=prec,
            DEPTH_STAGES=cfg.bwd_depth_stages, **meta)

    def q_launch(MODE):
        S = _depth_sub(cfg, G, cfg.bwd_q_block_m) if MODE == BWDQ_FUSED else 1
        _moda_bwd_q_kernel[(triton.cdiv(T * gp, cfg.bwd_q_block_m), B * Hk)](
            q, k, v, kd_, vd_, do, lse, delta, dq, dkd_, dvd_, *args, *st,
            GP=gp, BLOCK_M=cfg.bwd_q_block_m, BLOCK_N=cfg.bwd_q_block_n, HEAD_DIM=d, MODE=MODE, S=S,
            BLOCK_L=cfg.bwd_block_l, PREC=prec, DEPTH_STAGES=cfg.bwd_depth_stages, REVERSE=cfg.reverse,
            num_warps=cfg.bwd_q_warps, num_stages=cfg.bwd_q_stages)

    kv_meta = dict(num_warps=cfg.bwd_kv_warps, num_stages=cfg.bwd_kv_stages)
    if mode in ("none", "fused"):
        q_launch(BWDQ_SEQ if mode == "none" else BWDQ_FUSED)
        kv_launch(True, False, **kv_meta)
    elif mode == "split":
        kv_launch(False, True, num_warps=cfg.bwd_depth_warps, num_stages=1)
        if depth_only:
            return dq, None, None, dkd, dvd
        q_launch(BWDQ_ADD)
        kv_launch(True, False, **kv_meta)
    elif mode == "stream":  # depth-only kernel on a side stream, concurrent with the dk/dv pass
        _run_beside(q.device, lambda: kv_launch(True, False, **kv_meta),
                    lambda: kv_launch(False, True, num_warps=cfg.bwd_depth_warps, num_stages=1),
                    cfg.bwd_depth_after)
        q_launch(BWDQ_ADD)
    else:  # overlap: depth programs ride in the kv-major grid, the q-major pass adds their dq
        kv_launch(True, True, **kv_meta)
        q_launch(BWDQ_ADD)
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
