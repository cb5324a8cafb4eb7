"""Forward Triton kernels of the fused MoDA kernel (launched by `moda_bench.kernels.moda.triton.interface`).

`moda_fwd_kernel` runs one program per block of BLOCK_M folded rows (r = t*GP + g) and KV head;
its MODE (FWD_*) says which phases a program computes: the causal sequence loop, the depth
phase over the block's own positions (batched sub-tiles, `triton_utils.depth_tile`), or both
under one online softmax, possibly starting from a depth partial already in O/LSE.
`moda_merge_kernel` merges two normalised partials (o, lse) by log-sum-exp into buffers of its own.
"""
from __future__ import annotations

import triton
import triton.language as tl

from moda_bench.kernels.moda.triton.utils import depth_base, depth_tile, key_span, lse_merge, mm, row_ptrs

NEG = tl.constexpr(-1.0e30)  # finite "minus infinity": fully masked (padding) rows stay finite


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


# Forward kernel modes (what a program of moda_fwd_kernel computes):
FWD_SEQ = 0        # sequence phase only (L = 0)
FWD_FUSED = 1      # sequence then depth phase in one program, one online softmax
FWD_SEQ_INIT = 2   # sequence phase starting from the depth partial (o_d, lse_d) found in O, LSE
FWD_BOTH = 3       # programs [0, n_seq) do the sequence phase into O/LSE, the rest the depth phase
                   # into OD/LSED (two partials merged afterwards by moda_merge_kernel)
FWD_DEPTH = 4      # depth phase only, into OD/LSED


@triton.jit
def _fwd_depth_phase(q, acc, m_i, l_i, KD, VD, dbase, t_lo, T, L, sdt, sdl, qk_scale,
                     NB: tl.constexpr, S: tl.constexpr, R: tl.constexpr, GP: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_L: tl.constexpr, HEAD_DIM: tl.constexpr, PREC: tl.constexpr, DEPTH_STAGES: tl.constexpr):
    """Fold the depth keys of the block's positions into (acc, m_i, l_i) with batched tiles."""
    q3 = tl.reshape(q, (NB, R, HEAD_DIM))
    dbase = dbase + depth_base(t_lo, sdt)
    for f0 in tl.range(0, S * L, BLOCK_L, num_stages=DEPTH_STAGES):
        offs, ld_ok, own = depth_tile(t_lo, f0, T, L, sdt, sdl, NB, S, R, GP, BLOCK_L, HEAD_DIM)
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
    q = tl.load(row_ptrs(Q, b, j, rows, offs_d, G, sqb, sqt, sqh, GP), mask=row_ok[:, None], other=0.0)
    o_ptrs = row_ptrs(O, b, j, rows, offs_d, G, sob, sot, soh, GP)
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
        kbase, vbase, n_full, t_end = key_span(K, V, b, j, skb, skh, svb, svh, t_lo, T, P, BLOCK_N)
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
def moda_fwd_kernel(
    Q, K, V, KD, VD, O, LSE, OD, LSED,
    qk_scale, T, L, G, Hk, n_seq, n_bh,
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh,
    sdb, sdt, sdl, sdh,
    sob, sot, soh, slb, slt, slh,
    GP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    MODE: tl.constexpr, S: tl.constexpr, BLOCK_L: tl.constexpr, PREC: tl.constexpr,
    DEPTH_STAGES: tl.constexpr, REVERSE: tl.constexpr,
):
    """Grid (programs along rows, B*Hk); 1-D for FWD_DEPTH: n_seq work items (B*Hk*row blocks),
    one program each or fewer persistent programs. MODE: one of FWD_* above. OD/LSED share
    O/LSE's strides. REVERSE visits row blocks last-first (the causally heaviest first)."""
    if MODE == 4:  # depth-only launch, 1-D grid with (b, KV head) fastest: programs in flight read
        # neighbouring heads of the same positions, whose depth entries are contiguous in memory.
        # n_seq is the number of work items here; a grid smaller than that is persistent (each
        # program strides through the items), so the launch holds at most that many slots.
        for w in range(tl.program_id(0), n_seq, tl.num_programs(0)):
            pid_bh = w % n_bh
            _fwd_program(w // n_bh, pid_bh // Hk, pid_bh % Hk, Q, K, V, KD, VD, OD, LSED, qk_scale, T, L, G,
                         sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdl, sdh,
                         sob, sot, soh, slb, slt, slh, GP, BLOCK_M, BLOCK_N, HEAD_DIM,
                         False, True, False, S, BLOCK_L, PREC, DEPTH_STAGES)
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
        else:
            pid_m = (tl.num_programs(0) - 1 - pid0) if REVERSE else pid0
            _fwd_program(pid_m, b, j, Q, K, V, KD, VD, O, LSE, qk_scale, T, L, G,
                         sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdl, sdh,
                         sob, sot, soh, slb, slt, slh, GP, BLOCK_M, BLOCK_N, HEAD_DIM,
                         True, MODE == 1, MODE == 2, S, BLOCK_L, PREC, DEPTH_STAGES)


@triton.jit
def moda_merge_kernel(O1, LSE1, O2, LSE2, O, LSE, n_rows, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    """(O, LSE) <- softmax merge of the two partials (O1, LSE1) and (O2, LSE2) over the flattened
    (B*T*Hq, d) rows (all six contiguous). The outputs are buffers of their own: merged in place
    (O = O1), a program's threads stored some rows before others had loaded them (Triton 3.6 gave
    the load and the store different thread layouts: a few rows differed from run to run at long T,
    `experiments/overlap_check.py --lse`; docs/DESIGN.md, "The merge route")."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    ok = rows < n_rows
    l1 = tl.load(LSE1 + rows, mask=ok, other=0.0)
    l2 = tl.load(LSE2 + rows, mask=ok, other=0.0)
    a1, a2, lse = lse_merge(l1, l2)
    optr = rows.to(tl.int64)[:, None] * HEAD_DIM + offs_d[None, :]
    o1 = tl.load(O1 + optr, mask=ok[:, None], other=0.0).to(tl.float32)
    o2 = tl.load(O2 + optr, mask=ok[:, None], other=0.0).to(tl.float32)
    o = o1 * a1[:, None] + o2 * a2[:, None]
    tl.store(O + optr, o.to(O.dtype.element_ty), mask=ok[:, None])
    tl.store(LSE + rows, lse, mask=ok)
