"""Triton kernels of the MoDA decode operator (flash-decoding), launched by
`moda_bench.kernels.decode.interface`.

`decode_split_kernel`: grid (B*Hk, row_blocks*S). Program (b, KV head j, split s, row block)
holds, as the rows of its tile, the query rows r = i*G + g (new token i, query head j*G + g) of
KV head j, so the cache of (b, j) is read once for all G heads and Tq tokens. Sequence b's n_b
cache positions are cut into S contiguous spans of `split_span(n_b, S, BLOCK_N)` keys (a
multiple of BLOCK_N); split s runs the online softmax over its span: BLOCK_N-key tiles that
every row sees first (no mask), then the tiles reaching the causal tail (row i sees positions
<= n_b - Tq + i). The last split (s = S-1) also folds in the L depth entries of each new token
(the flat Tq*L depth axis in BLOCK_L tiles, masked so that row i sees only token i's entries).
With S > 1 it writes a normalised fp32 partial (o, lse in log2 units) to the partial buffers;
splits whose span is empty (ragged sequences) write nothing. With S = 1 (DIRECT) it writes
the output itself.

With TMA (a dense cache, `DecodeConfig.tma`) the cache tiles are read through tensor
descriptors (TMA bulk copies on Hopper) instead of pointer loads.

`decode_combine_kernel`: one program per output row (b, i, h): merges the used splits of its
row by log-sum-exp (which splits were used, it recomputes from n_b as the split kernel did).
With FUSED_COMBINE the split kernel does that merge itself, in the last program of each row
block to finish (an arrival counter per row block), and the combine launch is not made. Both
run the same merge, `merge_row`.

PDL (`DecodeConfig.pdl`, set by the launcher only on sm_90+ outside the interpreter, never with
FUSED_COMBINE or DIRECT): the combine is launched with Programmatic Dependent Launch; each split
program signals at its start that the combine may be scheduled (gdc_launch_dependents), and the
combine waits (gdc_wait) for the whole split grid before it reads a partial. Both are constexpr
branches: with PDL off neither is traced and the kernels are those without the knob.

Bad values that were not checked on the host (the GPU path skips the device sync) never read
out of bounds: a sequence with n_b outside [Tq, Tk] reads nothing and gets NaN rows, a key
whose page index is outside [0, num_blocks) is not loaded and turns its rows' output to NaN.
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from moda_bench.kernels.moda.triton.utils import mm

NEG = tl.constexpr(-1.0e30)  # finite start of the running max: fully masked rows stay finite


@triton.jit
def split_span(n, S, BLOCK_N: tl.constexpr):
    """Keys per split for a sequence of n tokens cut into S splits: a multiple of BLOCK_N, >= BLOCK_N."""
    return tl.maximum(tl.cdiv(tl.cdiv(n, S), BLOCK_N), 1) * BLOCK_N


@triton.jit
def seq_len(SEQLENS, b, Tq, Tk, HAS_SEQLENS: tl.constexpr):
    """(n, bad): the tokens sequence b holds (0 when out of [Tq, Tk]) and whether it was out."""
    if HAS_SEQLENS:
        n = tl.load(SEQLENS + b)
    else:
        n = Tk + 0 * b
    bad = (n < Tq) | (n > Tk)
    return tl.where(bad, 0, n), bad


@triton.jit
def _online(s, acc, m_i, l_i, v, PREC: tl.constexpr):
    """Fold scores s [rows, cols] (log2 units, -inf = masked) and their values v [cols, d] into
    the running (acc, m_i, l_i)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    acc = acc * alpha[:, None] + mm(p.to(v.dtype), v, PREC)
    return acc, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _cache_rows(base, kn, in_range, page, slot, ld, sb, st, HEAD_DIM: tl.constexpr, PAGED: tl.constexpr,
                MASKED: tl.constexpr):
    """The [BLOCK_N, d] tile of cache rows kn of one tensor (K or V) whose row base is `base`.
    Paged: rows at (page, slot) with strides (sb, st), loaded where `ld`; dense: row kn with stride
    st, masked by `in_range` when MASKED (page, slot, ld, sb are then unused)."""
    offs_d = tl.arange(0, HEAD_DIM)
    if PAGED:
        rows = tl.load(base + (page.to(tl.int64) * sb + slot * st)[:, None] + offs_d[None, :],
                       mask=ld[:, None], other=0.0)
    elif MASKED:
        rows = tl.load(base + (kn.to(tl.int64) * st)[:, None] + offs_d[None, :], mask=in_range[:, None],
                       other=0.0)
    else:
        rows = tl.load(base + (kn.to(tl.int64) * st)[:, None] + offs_d[None, :])
    return rows


@triton.jit
def _seq_tile(q, acc, m_i, l_i, kbase, vbase, BT, bt_row, start, hi, last, n_pages,
              skb, skt, svb, svt, qk_scale,
              BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, PAGED: tl.constexpr,
              MASKED: tl.constexpr, PREC: tl.constexpr):
    """One tile of BLOCK_N cache keys from `start`. MASKED: keys >= hi are not loaded and row r
    sees keys <= last[r]; otherwise every key of the tile is seen by every row."""
    kn = start + tl.arange(0, BLOCK_N)
    in_range = kn < hi
    if PAGED:
        if MASKED:
            page = tl.load(BT + bt_row + kn // PAGE_SIZE, mask=in_range, other=0)
        else:
            page = tl.load(BT + bt_row + kn // PAGE_SIZE)
        page_ok = (page >= 0) & (page < n_pages)
        ld = page_ok & in_range
        slot = kn % PAGE_SIZE
    else:
        page, slot, ld = kn, kn, in_range   # unused by the dense loads
    k = _cache_rows(kbase, kn, in_range, page, slot, ld, skb, skt, HEAD_DIM, PAGED, MASKED)
    s = mm(q, tl.trans(k), PREC) * qk_scale
    if MASKED:
        s = tl.where(in_range[None, :] & (kn[None, :] <= last[:, None]), s, float("-inf"))
    if PAGED:
        s = tl.where(page_ok[None, :], s, float("nan"))
    v = _cache_rows(vbase, kn, in_range, page, slot, ld, svb, svt, HEAD_DIM, PAGED, MASKED)
    return _online(s, acc, m_i, l_i, v, PREC)


@triton.jit
def _seq_tile_tma(q, acc, m_i, l_i, KDESC, VDESC, b, j, start, hi, last, qk_scale,
                  BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr, PREC: tl.constexpr):
    """`_seq_tile` of a dense cache through tensor descriptors (TMA bulk copies on Hopper): the
    K and V tiles of keys start .. start + BLOCK_N of (sequence b, KV head j). Rows past the
    cache's end come as zeros; rows in [hi, Tk) are loaded (whatever they hold), so MASKED tiles
    mask their scores and zero their values."""
    kn = start + tl.arange(0, BLOCK_N)
    k = tl.reshape(KDESC.load([b, start, j, 0]), [BLOCK_N, HEAD_DIM])
    s = mm(q, tl.trans(k), PREC) * qk_scale
    v = tl.reshape(VDESC.load([b, start, j, 0]), [BLOCK_N, HEAD_DIM])
    if MASKED:
        in_range = kn < hi
        s = tl.where(in_range[None, :] & (kn[None, :] <= last[:, None]), s, float("-inf"))
        v = tl.where(in_range[:, None], v, 0.0)
    return _online(s, acc, m_i, l_i, v, PREC)


@triton.jit
def _depth_tile(q, acc, m_i, l_i, KD, VD, dbase, f0, tok_row, Tq, L, sdt, sdl, qk_scale,
                BLOCK_L: tl.constexpr, HEAD_DIM: tl.constexpr, PREC: tl.constexpr):
    """Depth columns f0 .. f0+BLOCK_L of the flat (Tq*L) depth axis: column f is entry f % L of
    new token f // L, seen only by the rows of that token."""
    offs_d = tl.arange(0, HEAD_DIM)
    f = f0 + tl.arange(0, BLOCK_L)
    tok = f // L
    ok = f < Tq * L
    off = (tok * sdt + (f % L) * sdl)[:, None] + offs_d[None, :]
    kd = tl.load(KD + dbase + off, mask=ok[:, None], other=0.0)
    s = mm(q, tl.trans(kd), PREC) * qk_scale
    s = tl.where(ok[None, :] & (tok[None, :] == tok_row[:, None]), s, float("-inf"))
    vd = tl.load(VD + dbase + off, mask=ok[:, None], other=0.0)
    return _online(s, acc, m_i, l_i, vd, PREC)


@triton.jit
def merge_row(PO, PLSE, OUT, part, out_off, n_used, bad, S, R, BLOCK_S: tl.constexpr, HEAD_DIM: tl.constexpr,
              HAS_DEPTH: tl.constexpr):
    """The log-sum-exp merge of one output row, shared by `decode_combine_kernel` (one row per
    program) and the fused combine of `decode_split_kernel` (its last-arriving program, row by
    row): the partials (o, lse) of split s sit at row part + s*R of PO (x HEAD_DIM) and PLSE.
    Only splits s < n_used (those whose span covers keys) and, with depth, the last one (it took
    the depth entries) were written; the others are masked out (weight 0, never loaded), BLOCK_S
    splits a step. The row goes to OUT + out_off, NaN where `bad`. The loads bypass L1 (.cg):
    under the fused combine the partials were written by other programs (made visible by their
    release and this program's acquire at the arrival counter); here they are read once anyway."""
    offs_d = tl.arange(0, HEAD_DIM)
    m = tl.full([BLOCK_S], NEG, tl.float32)  # running max, the same in every lane
    l = tl.zeros([BLOCK_S], tl.float32)  # running sums per lane
    acc = tl.zeros([HEAD_DIM], tl.float32)
    for s0 in range(0, S, BLOCK_S):
        sid = s0 + tl.arange(0, BLOCK_S)
        ok = sid < n_used
        if HAS_DEPTH:
            ok = ok | (sid == S - 1)
        ok = ok & (sid < S)
        lse = tl.load(PLSE + part + sid * R, mask=ok, other=NEG, cache_modifier=".cg")
        m_new = tl.maximum(m, tl.max(lse, 0))
        alpha = tl.math.exp2(m - m_new)
        w = tl.where(ok, tl.math.exp2(lse - m_new), 0.0)
        o = tl.load(PO + (part + sid * R)[:, None] * HEAD_DIM + offs_d[None, :], mask=ok[:, None], other=0.0,
                    cache_modifier=".cg")
        acc = acc * tl.max(alpha, 0) + tl.sum(w[:, None] * o, 0)
        l = l * alpha + w
        m = m_new
    out = acc / tl.sum(l, 0)
    out = tl.where(bad, float("nan"), out)
    tl.store(OUT + out_off + offs_d, out.to(OUT.dtype.element_ty))


@triton.jit(do_not_specialize=["Tk", "n_pages"])
def decode_split_kernel(
    Q, K, V, KD, VD, SEQLENS, BT, O, LSE, KDESC, VDESC, OUT, CNT,
    qk_scale, Tq, Tk, L, G, Hk, R, S, n_rb, n_pages,
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdl, sdh, sbt, sob, sot, soh,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr, HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr, PAGED: tl.constexpr, HAS_SEQLENS: tl.constexpr, HAS_DEPTH: tl.constexpr,
    DIRECT: tl.constexpr, PREC: tl.constexpr, TMA: tl.constexpr, FUSED_COMBINE: tl.constexpr = False,
    COMBINE_BLOCK_S: tl.constexpr = 1, PDL: tl.constexpr = False,
):
    """Grid (B*Hk, n_rb*S). Dense cache: K/V strides (skb, skt, skh) over (b, t, head); paged:
    (page, slot, head) with block table BT (row stride sbt). DIRECT: O is the output
    (B, Tq, Hq, d) with strides (sob, sot, soh); else O is the fp32 partial buffer
    (B*Hk, S, R, d) and LSE (B*Hk, S, R), both contiguous. TMA (dense caches only): the cache
    tiles come through the tensor descriptors KDESC, VDESC over (B, Tk, Hk, d) with block
    (1, BLOCK_N, 1, d) instead of pointer loads (else KDESC, VDESC are unused).
    FUSED_COMBINE (not DIRECT): after writing its partial (a CTA barrier after the stores),
    every program adds 1 to its row block's int32 counter in CNT (B*Hk*n_rb, zero on entry;
    acq_rel, gpu scope); the one that finds S - 1 there is the last of the block's S programs
    (empty splits, which store nothing, arrive too): it merges the block's rows one by one into
    OUT (the output, strides sob, sot, soh) with `merge_row`, the combine kernel's code,
    COMBINE_BLOCK_S splits a step, and puts the counter back to 0, so the buffer needs no reset
    between calls. Else OUT, CNT, COMBINE_BLOCK_S are unused. PDL (not DIRECT, not
    FUSED_COMBINE): the combine kernel is launched next with launch_pdl; see the trigger below."""
    if PDL:
        # Where the trigger sits does not matter for correctness: the combine's gdc_wait returns
        # only once every program of this grid has exited and its stores are flushed, so the
        # trigger only decides when the combine's programs are put on the SMs. First thing,
        # because (1) the combine is scheduled only after every split program has triggered or
        # exited, i.e. after the last one has started, so its programs can never take SM room
        # from a split program still waiting for a slot; (2) at B=1 the split programs (about 2
        # an SM) run side by side and end together, so a trigger after the main loop would come
        # only shortly before the end and leave the combine's launch latency and prologue (its
        # indices and n_b) mostly exposed, while at the start they hide under the whole main
        # loop. The cost: the combine's programs (a few warps, little shared memory) sit blocked
        # on SMs meanwhile. If measurements show that costing the split kernel, move it after
        # the loops (before the epilogue stores): still correct, for the reason above.
        gdc_launch_dependents()
    bh = tl.program_id(0)
    pid1 = tl.program_id(1)
    rb = pid1 % n_rb
    sid = pid1 // n_rb
    b = bh // Hk
    j = bh % Hk
    b64 = b.to(tl.int64)
    n, bad = seq_len(SEQLENS, b, Tq, Tk, HAS_SEQLENS)
    span = split_span(n, S, BLOCK_N)
    lo = sid * span
    hi = tl.minimum(lo + span, n)

    rows = rb * ROWS + tl.arange(0, ROWS)
    row_ok = rows < R
    tok_row = rows // G
    head = j * G + rows % G
    last = n - Tq + tok_row  # the last cache position each row sees
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b64 * sqb + tok_row[:, None] * sqt + head[:, None] * sqh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    m_i = tl.full([ROWS], NEG, tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM], tl.float32)

    if HAS_DEPTH:  # the last split also takes the depth entries of the new tokens
        d_hi = tl.where(sid == S - 1, Tq * L, 0)
        dbase = b64 * sdb + j * sdh
        for f0 in range(0, d_hi, BLOCK_L):
            acc, m_i, l_i = _depth_tile(q, acc, m_i, l_i, KD, VD, dbase, f0, tok_row, Tq, L, sdt, sdl, qk_scale,
                                        BLOCK_L, HEAD_DIM, PREC)

    if PAGED:
        kbase = K + j * skh
        vbase = V + j * svh
    else:
        kbase = K + b64 * skb + j * skh
        vbase = V + b64 * svb + j * svh
    bt_row = b64 * sbt
    # keys below n - Tq + 1 are seen by every row: whole tiles of them run unmasked
    n_full = tl.maximum(tl.minimum(hi, n - Tq + 1) - lo, 0) // BLOCK_N
    mid = lo + n_full * BLOCK_N
    if TMA:
        for start in range(lo, mid, BLOCK_N):
            acc, m_i, l_i = _seq_tile_tma(q, acc, m_i, l_i, KDESC, VDESC, b, j, start, hi, last, qk_scale,
                                          BLOCK_N, HEAD_DIM, False, PREC)
        for start in range(mid, hi, BLOCK_N):
            acc, m_i, l_i = _seq_tile_tma(q, acc, m_i, l_i, KDESC, VDESC, b, j, start, hi, last, qk_scale,
                                          BLOCK_N, HEAD_DIM, True, PREC)
    else:
        for start in range(lo, mid, BLOCK_N):
            acc, m_i, l_i = _seq_tile(q, acc, m_i, l_i, kbase, vbase, BT, bt_row, start, hi, last, n_pages,
                                      skb, skt, svb, svt, qk_scale, BLOCK_N, HEAD_DIM, PAGE_SIZE, PAGED, False, PREC)
        for start in range(mid, hi, BLOCK_N):
            acc, m_i, l_i = _seq_tile(q, acc, m_i, l_i, kbase, vbase, BT, bt_row, start, hi, last, n_pages,
                                      skb, skt, svb, svt, qk_scale, BLOCK_N, HEAD_DIM, PAGE_SIZE, PAGED, True, PREC)

    seen = l_i > 0
    l_safe = tl.where(seen, l_i, 1.0)
    o = acc / l_safe[:, None]
    if DIRECT:
        o = tl.where(bad, float("nan"), o)
        tl.store(O + b64 * sob + tok_row[:, None] * sot + head[:, None] * soh + offs_d[None, :],
                 o.to(O.dtype.element_ty), mask=row_ok[:, None])
    else:
        # written only by splits that cover keys, or take the depth (vector form: the interpreter
        # mishandles bool-scalar & bool-vector masks)
        used = (rows * 0 + lo) < hi
        if HAS_DEPTH:
            used = used | ((rows * 0 + sid) == S - 1)
        prow = (bh.to(tl.int64) * S + sid) * R + rows
        tl.store(O + prow[:, None] * HEAD_DIM + offs_d[None, :], o, mask=(row_ok & used)[:, None])
        tl.store(LSE + prow, tl.where(seen, m_i + tl.math.log2(l_safe), NEG), mask=row_ok & used)
        if FUSED_COMBINE:
            # every thread's partial stores come before the barrier, the barrier before the one
            # thread's release (Triton runs a scalar atomic in thread 0 alone): cumulativity makes
            # the whole tile visible to the program that acquires the last arrival
            tl.debug_barrier()
            cidx = bh * n_rb + rb
            arrived = tl.atomic_add(CNT + cidx, 1, sem="acq_rel", scope="gpu")
            if arrived == S - 1:  # the others' partials are all written: merge this row block
                n_used = tl.cdiv(n, span)
                for r in range(rb * ROWS, tl.minimum(rb * ROWS + ROWS, R)):
                    merge_row(O, LSE, OUT, bh.to(tl.int64) * S * R + r,
                              b64 * sob + (r // G) * sot + (j * G + r % G) * soh, n_used, bad, S, R,
                              COMBINE_BLOCK_S, HEAD_DIM, HAS_DEPTH)
                # no later access of this launch reads the counter: relaxed suffices (the next
                # launch on the stream starts after this one's writes)
                tl.atomic_xchg(CNT + cidx, 0, sem="relaxed", scope="gpu")


@triton.jit(do_not_specialize=["Tk"])
def decode_combine_kernel(
    PO, PLSE, O, SEQLENS, Tq, Tk, G, Hk, R, S, sob, sot, soh,
    BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr, HEAD_DIM: tl.constexpr, HAS_SEQLENS: tl.constexpr,
    HAS_DEPTH: tl.constexpr, PDL: tl.constexpr = False,
):
    """Grid (B*Hk*R,): output row (b, token i, head j*G + g) <- the log-sum-exp merge of the
    partials its splits wrote (split kernel's BLOCK_N, to recompute which splits were used).
    PDL: launched with launch_pdl, it may start while the split kernel still runs."""
    pid = tl.program_id(0)
    bh = pid // R
    r = pid % R
    b = bh // Hk
    j = bh % Hk
    n, bad = seq_len(SEQLENS, b, Tq, Tk, HAS_SEQLENS)
    n_used = tl.cdiv(n, split_span(n, S, BLOCK_N))
    i = r // G
    head = j * G + r % G
    if PDL:
        # Above, only SEQLENS is read: written (if at all) by work before the split kernel,
        # which began only after that work had finished, so it is safe to read early. The
        # partials (and the output, stored after them) wait until the split grid has completed
        # and its memory is flushed.
        gdc_wait()
    merge_row(PO, PLSE, O, bh.to(tl.int64) * S * R + r, b.to(tl.int64) * sob + i * sot + head * soh, n_used, bad,
              S, R, BLOCK_S, HEAD_DIM, HAS_DEPTH)
