"""The folded-row backward of the fused MoDA kernel (`MoDAConfig.bwd_depth = "tma"`): two passes
over group-folded rows with per-row softmax statistics in flat buffers, every tile loaded through
a tensor descriptor (TMA on Hopper; built on the host at T <= 8192, `host_desc_bwd`, else by each
program: `descriptors`) or, where descriptors are unusable, through masked pointers (USE_DESC=False,
the same arithmetic). Launched by `kernel.moda_bwd` (through
`moda_bwd_tma`); `experiments/bwd_tma_triton.py` times its variants (docs/DESIGN.md, "The Triton
kernel").

q, o, do (B,T,Hq,d); k, v (B,T,Hk,d); k_depth, v_depth (B,T,L,Hk,d) or None (L = 0), all
contiguous; lse (B,T,Hq) float32, natural log. Returns (dq, dk, dv, dk_depth, dv_depth); the depth
gradients are None at L = 0 or with depth_grad=False (detached depth: their products and stores
are compiled out, the depth part still adds its share of dq).

Design:
* Rows: for KV head j the G query heads are folded into the row axis, r = t*GP + g (GP =
  next_pow2(G); rows g >= G are padding). BM rows are P = BM/GP whole positions, loaded as one
  [1, P, GP, d] box of the (B,T,Hq,d) tensor, so a K/V tile serves the G heads at once. exp2
  with the scale folded in.
* Query-major pass first (`_dq_kernel`, a program per (BM rows, batch*KV head), the last row blocks
  first, or heavy and light blocks alternately at T <= 8192, `dq_mix`): it computes its rows' lse2 =
  lse*log2(e) (+inf on padding rows, so that their probabilities are exactly 0 everywhere) and delta
  = rowsum(o*do) and stores them in flat (B*Hk, RP) fp32 buffers for the key-major pass (no
  preprocessing launch; the last block also fills the rows after it that the key-major pass's last
  steps read, so that pass loads them unmasked: RP = rows of the dq blocks + kv_block_m); then dq
  over the key tiles wholly below its first position (unmasked) and the diagonal ones; then the
  depth part: the P positions in NB = P/S sub-tiles of S positions (R = S*GP >= 16 rows, one
  tensor-core tile) against their own S*BL depth columns a step, a batched product, with dk_depth,
  dv_depth of the block's positions stored by descriptor (a depth entry is read by the G rows of its
  own position only: no atomics).
* At L = 0, G a power of two above 1, the dq pass may take a query head a program (`_dq_head_kernel`).
* Key-major pass (`_kv_kernel`, a program per (BN keys, batch*KV head), grid (B*Hk, n_tiles):
  the heaviest tiles of every head first, then the lighter ones, which balances the causal
  triangle): K/V loaded once, BM rows a step from the tile's first position: cdiv(BN, P) masked
  diagonal steps, then the unmasked loop. Transposed products (qk^T = k q^T, dv += p^T do,
  dp^T = v do^T, dk += ds^T q), no register transpose of an accumulator. Inside a CUDA graph
  capture at small grids (`kv_beside`) it runs beside the query-major pass on a second stream,
  computing its rows' lse2 and delta itself (`row_stats`).
* Product order: where the key-major pass's registers are not capped its step issues dp^T =
  v do^T before the exponentials of its scores (DP_FIRST, `kernel_bwd_rules.dp_first`), so the
  tensor cores work while the exponential unit does; the dq pass keeps dp after them.
* Registers: `kv_maxnreg` / `q_maxnreg` cap a pass's registers per thread (0: the compiler's
  choice); 168 at 4 warps lets three programs share an SM (`config.BWD_TMA_MAXNREG`; measured in
  docs/DESIGN.md, "The Triton kernel").
* One launch (`bwd_kv_beside` = 2; by default in eager calls at T <= 1024 where L > 0,
  `kernel_bwd_rules.kv_one`): `_one_kernel`'s grid holds the dq pass's row blocks first, each
  counting itself ready once its rows' statistics are stored, then the key-major items, which
  wait for their head's blocks: a launch and its host work fewer a call, where the host's issue
  time bounds the call (short eager calls), at about the two launches' GPU time.
The tile helpers live in `kernel_bwd_parts` and are re-exported here: experiments/bwd_tma_triton.py builds
its variants (an atomic-dQ key-major pass) from them.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from moda_bench.kernels.counters import arrival_counters, scratch, scratch_views, stream_state
from moda_bench.kernels.launch import CachedLaunch, aligned16
from moda_bench.kernels.moda.triton.bwd_tma_rules import (  # noqa: F401
    DQ_MIX_MAX_T,
    KV_BESIDE_MAX_G,
    KV_BESIDE_MAX_WAVES,
    KV_CHUNK_MIN_STEPS,
    KV_CHUNK_SLACK,
    KV_CHUNK_SLOTS,
    bwd_depth_geometry,
    bwd_plan,
    dq_mix,
    host_desc_bwd,
    kv_beside,
    kv_chunk,
    kv_depth_items,
    kv_items,
)
from moda_bench.kernels.moda.triton.bwd_tma_tiles import (  # noqa: F401
    chunk_item,
    depth_item,
    depth_part,
    dq_block,
    dq_rows,
    dq_step,
    kv_item,
    row_stats,
    store_kv,
)
from moda_bench.kernels.moda.triton.descriptors import (  # noqa: F401
    depth_desc,
    depth_descs,
    depth_descs_at,
    depth_hdesc,
    ensure_allocator,
    keys_desc,
    keys_hdesc,
    keys_tile,
    rows_desc,
    rows_hdesc,
    rows_ptr,
    rows_tile,
)
from moda_bench.kernels.moda.triton.utils import interpreting

LOG2E = 1.4426950408889634
_KV_COUNTERS: dict = {}  # arrival counters and partials' buffers of the chunked key-major pass (`counters`)
_ONE_COUNTERS: dict = {}  # the one launch's ready and done counters (`_one_kernel`'s WAIT)
_STATS: dict = {}  # the rows' lse2 and delta, a buffer a stream (`counters.scratch_views`)


@triton.jit(do_not_specialize=["B", "T", "L", "LD", "G", "Hk", "NCH", "N_ITEMS", "N_TILES", "N_DEPTH"])
def _kv_kernel(Q, K, V, DO, O, LSE, LSE2, DELTA, DK, DV, WS, CNT, KD, VD, DQ, DKD, DVD, qk_scale, sm_scale, B, T, L,
               LD, G, Hk, RP, NCH, N_ITEMS, N_TILES, N_DEPTH, sdb, sdt, sdl, sgb, sgt, sgl, GP: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, USE_DESC: tl.constexpr, PREC: tl.constexpr,
               STATS: tl.constexpr, CHUNK: tl.constexpr, DEPTH_ITEMS: tl.constexpr, S: tl.constexpr, BL: tl.constexpr,
               DEPTH_STAGES: tl.constexpr, DEPTH_GRAD: tl.constexpr, DP_FIRST: tl.constexpr, NSUB: tl.constexpr,
               POLY: tl.constexpr, HOST_DESC: tl.constexpr, DEPTH_ACC: tl.constexpr, STRIDED: tl.constexpr):
    """Key-major pass: dk, dv of BN keys of (batch, KV head); grid (B*Hk, cdiv(T, BN)). STATS: it
    computes its rows' lse2 and delta itself (from LSE, O, DO), so it may run beside the dq pass.
    CHUNK > 0 (positions, a multiple of BN): grid (B*Hk, N_ITEMS), a program per (key tile, chunk
    of its rows) (`chunk_item`); a tile of several chunks stores each chunk's fp32 dk, dv in WS
    (B*Hk, N_ITEMS, 2, BN, D) and counts in CNT (B*Hk*N_TILES int32, 0 on entry), and the chunk
    that arrives last sums them in chunk order (deterministic), stores, and puts its counter back.
    DEPTH_ITEMS: the grid also holds N_DEPTH depth items a (batch, KV head), one per BM rows
    (`depth_item`), spread evenly among the N_ITEMS key items, so that the depth bytes stream while
    the key items compute (the dq pass then skipped its depth part).
    NSUB > 1 (neither STATS nor DEPTH_ITEMS): grid (B*Hk*NSUB, N_ITEMS), a program per (key item,
    sub-group of GP // NSUB heads): a step's BM rows then span NSUB times the positions, so the
    programs of one head read the same q/do rows NSUB times sooner after each other (L2 reuse);
    the sub-groups' fp32 dk, dv go to WS like chunks', the last to arrive sums them. HOST_DESC: Q, DO,
    K, V (and O with STATS) are host-side descriptors (`descriptors`), not tensors. The NSUB = 1
    branches here, in `kv_item` and `_kv_step` keep the expressions the unsplit pass had before
    sub-groups: folded alike, they still compiled to more SASS and spills (`tools/sass_diff.py`).
    DEPTH_ACC, STRIDED (depth items): `depth_part`'s, with the strides (sdb, sdt, sdl) of KD, VD and
    (sgb, sgt, sgl) of DKD, DVD (unread unless STRIDED)."""
    GS: tl.constexpr = GP // NSUB
    P: tl.constexpr = BM // GS
    bhs = tl.program_id(0)
    u = tl.program_id(1)
    if NSUB == 1:
        bh = bhs
        sub = 0
    else:
        bh = bhs // NSUB
        sub = bhs % NSUB
    b = bh // Hk
    j = bh % Hk
    qdesc = None
    dodesc = None
    odesc = None
    if HOST_DESC:
        qdesc, dodesc = Q, DO
        if STATS:
            odesc = O
    elif USE_DESC:
        qdesc = rows_desc(Q, B, T, G * Hk, P, GS, D)
        dodesc = rows_desc(DO, B, T, G * Hk, P, GS, D)
        if STATS:
            odesc = rows_desc(O, B, T, G * Hk, P, GP, D)
    if DEPTH_ITEMS:  # key item i at (i * total) // N_ITEMS, depth items evenly between
        total = N_ITEMS + N_DEPTH
        i = tl.cdiv(u * N_ITEMS, total)
        is_depth = (i >= N_ITEMS) | ((i * total) // N_ITEMS != u)
        idx = tl.where(is_depth, u - tl.cdiv((u + 1) * N_ITEMS, total), i)
        if is_depth:
            kddesc, vddesc, dkddesc, dvddesc = None, None, None, None
            if USE_DESC and STRIDED:
                kddesc, vddesc = depth_descs_at(KD, VD, B, T, LD, Hk, sdb, sdt, sdl, P, BL, D)
                if DEPTH_GRAD:
                    dkddesc, dvddesc = depth_descs_at(DKD, DVD, B, T, LD, Hk, sgb, sgt, sgl, P, BL, D)
            elif USE_DESC:
                kddesc, vddesc = depth_descs(KD, VD, B, T, LD, Hk, P, BL, D)
                if DEPTH_GRAD:
                    dkddesc, dvddesc = depth_descs(DKD, DVD, B, T, LD, Hk, P, BL, D)
            depth_item(Q, DO, KD, VD, DQ, DKD, DVD, LSE2, DELTA, qdesc, dodesc, kddesc, vddesc, dkddesc, dvddesc, b,
                       j, bh, idx * P, T, L, G, Hk, RP, qk_scale, sm_scale, GP, BM, D, S, BL, USE_DESC, PREC,
                       DEPTH_STAGES, DEPTH_GRAD, DEPTH_ACC, STRIDED, (sdb, sdt, sdl, sgb, sgt, sgl))
        else:
            kv_item(Q, K, V, DO, O, LSE, LSE2, DELTA, DK, DV, WS, CNT, qdesc, dodesc, odesc, qk_scale, sm_scale, B,
                    T, G, Hk, RP, NCH, N_ITEMS, N_TILES, bh, b, j, idx, 0, GP, 1, BM, BN, D, USE_DESC, PREC, STATS,
                    CHUNK, DP_FIRST, POLY, HOST_DESC)
    else:
        kv_item(Q, K, V, DO, O, LSE, LSE2, DELTA, DK, DV, WS, CNT, qdesc, dodesc, odesc, qk_scale, sm_scale, B, T,
                G, Hk, RP, NCH, N_ITEMS, N_TILES, bh, b, j, u, sub, GP, NSUB, BM, BN, D, USE_DESC, PREC, STATS, CHUNK,
                DP_FIRST, POLY, HOST_DESC)


@triton.jit(do_not_specialize=["B", "T", "L", "LD", "G", "Hk", "n_m"])
def _dq_kernel(Q, K, V, KD, VD, O, DO, LSE, LSE2, DELTA, DQ, DKD, DVD, qk_scale, sm_scale, B, T, L, LD, G, Hk, RP,
               n_m, sdb, sdt, sdl, sgb, sgt, sgl, GP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
               TAIL: tl.constexpr, D: tl.constexpr, S: tl.constexpr, BL: tl.constexpr, DEPTH: tl.constexpr,
               DEPTH_GRAD: tl.constexpr, USE_DESC: tl.constexpr, PREC: tl.constexpr, DEPTH_STAGES: tl.constexpr,
               MIX: tl.constexpr, DP_FIRST: tl.constexpr, POLY: tl.constexpr, HOST_DESC: tl.constexpr,
               DEPTH_ACC: tl.constexpr, STRIDED: tl.constexpr):
    """Query-major pass, grid (B*Hk, n_m): a row block a program (`dq_block`), its rows' lse2 and
    delta stored for the key-major pass (DEPTH_ACC, STRIDED and the strides as `_kv_kernel`'s)."""
    dq_block(Q, K, V, KD, VD, O, DO, LSE, LSE2, DELTA, DQ, DKD, DVD, qk_scale, sm_scale, B, T, L, LD, G, Hk, RP, n_m,
             tl.program_id(0), tl.program_id(1), GP, BM, BN, TAIL, D, S, BL, DEPTH, DEPTH_GRAD, USE_DESC, PREC,
             DEPTH_STAGES, MIX, DP_FIRST, POLY, HOST_DESC, True, None, False, DEPTH_ACC, STRIDED,
             (sdb, sdt, sdl, sgb, sgt, sgl))


@triton.jit(do_not_specialize=["B", "T", "L", "LD", "G", "Hk", "RP", "n_m", "NCH", "N_ITEMS", "N_TILES"])
def _one_kernel(Q, K, V, KD, VD, O, OD, DO, LSE, LSE2, DELTA, DQ, DK, DV, WS, CNT, SYNC, DKD, DVD, qk_scale, sm_scale,
                B, T, L, LD, G, Hk, RP, n_m, NCH, N_ITEMS, N_TILES, sdb, sdt, sdl, sgb, sgt, sgl, GP: tl.constexpr,
                BM: tl.constexpr,
                BN: tl.constexpr, TAIL: tl.constexpr, D: tl.constexpr, S: tl.constexpr, BL: tl.constexpr,
                DEPTH: tl.constexpr, DEPTH_GRAD: tl.constexpr, USE_DESC: tl.constexpr, PREC: tl.constexpr,
                DEPTH_STAGES: tl.constexpr, MIX: tl.constexpr, DP_FIRST: tl.constexpr, POLY: tl.constexpr,
                CHUNK: tl.constexpr, KV_DP_FIRST: tl.constexpr, KV_POLY: tl.constexpr, HOST_DESC: tl.constexpr,
                WAIT: tl.constexpr, DEPTH_ACC: tl.constexpr, STRIDED: tl.constexpr):
    """Both passes in one launch, grid (B*Hk, N_ITEMS + n_m), sharing their tiles (BM rows, BN keys),
    warps and stages; the key-major items are `kv_item`s (CHUNK as `_kv_kernel`'s), the rest the dq
    pass's row blocks (`dq_block`, o by pointers). Two orders:
    * WAIT: the row blocks first; each stores its rows' lse2 and delta as the dq pass does and then
      counts itself ready in SYNC[bh] (release); a key-major item waits until all n_m blocks of its
      (batch, KV head) have (acquire) and reads them. Blocks run in grid order on the GPU (a wave's
      programs start before the next wave's), so every block an item waits for has started: no
      item waits for a block that cannot run. Every program then counts itself done in
      SYNC[B*Hk]; the last puts all B*Hk + 1 counters back to 0 (`counters.arrival_counters`).
    * else: the key-major items first, each computing its rows' lse2 and delta itself (`row_stats`,
      o through OD), the row blocks after, storing none.
    HOST_DESC: Q, DO, K, V, OD (and KD, VD with DEPTH; DKD, DVD with DEPTH_GRAD) are host-side
    descriptors; O is the tensor. DEPTH_ACC, STRIDED and the strides: `_kv_kernel`'s."""
    P: tl.constexpr = BM // GP
    bh = tl.program_id(0)
    u = tl.program_id(1)
    if WAIT:
        is_kv = u >= n_m
        kv_u = u - n_m
        dq_i = u
    else:
        is_kv = u < N_ITEMS
        kv_u = u
        dq_i = u - N_ITEMS
    if is_kv:
        qdesc = None
        dodesc = None
        odesc = None
        if HOST_DESC:
            qdesc, dodesc, odesc = Q, DO, OD
        elif USE_DESC:
            qdesc = rows_desc(Q, B, T, G * Hk, P, GP, D)
            dodesc = rows_desc(DO, B, T, G * Hk, P, GP, D)
            odesc = rows_desc(O, B, T, G * Hk, P, GP, D)
        if WAIT:
            ready = tl.atomic_add(SYNC + bh, 0, sem="acquire", scope="gpu")
            while ready < n_m:
                ready = tl.atomic_add(SYNC + bh, 0, sem="acquire", scope="gpu")
        kv_item(Q, K, V, DO, O, LSE, LSE2, DELTA, DK, DV, WS, CNT, qdesc, dodesc, odesc, qk_scale, sm_scale, B, T, G,
                Hk, RP, NCH, N_ITEMS, N_TILES, bh, bh // Hk, bh % Hk, kv_u, 0, GP, 1, BM, BN, D, USE_DESC, PREC,
                not WAIT, CHUNK, KV_DP_FIRST, KV_POLY, HOST_DESC)
    else:
        dq_block(Q, K, V, KD, VD, O, DO, LSE, LSE2, DELTA, DQ, DKD, DVD, qk_scale, sm_scale, B, T, L, LD, G, Hk, RP,
                 n_m, bh, dq_i, GP, BM, BN, TAIL, D, S, BL, DEPTH, DEPTH_GRAD, USE_DESC, PREC, DEPTH_STAGES, MIX,
                 DP_FIRST, POLY, HOST_DESC, WAIT, SYNC, WAIT, DEPTH_ACC, STRIDED, (sdb, sdt, sdl, sgb, sgt, sgl))
    if WAIT:  # the last program done puts the counters back
        tl.debug_barrier()
        n_bh = tl.num_programs(0)
        done = tl.atomic_add(SYNC + n_bh, 1, sem="acq_rel", scope="gpu")
        if done == n_bh * tl.num_programs(1) - 1:
            for c0 in range(0, n_bh, 128):
                c = c0 + tl.arange(0, 128)
                tl.store(SYNC + c, tl.zeros([128], tl.int32), mask=c < n_bh)
            tl.atomic_xchg(SYNC + n_bh, 0, sem="relaxed", scope="gpu")


@triton.jit(do_not_specialize=["B", "T", "G", "Hk", "RP"])
def _dq_head_kernel(Q, K, V, O, DO, LSE, LSE2, DELTA, DQ, qk_scale, sm_scale, B, T, G, Hk, RP, GP: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, TAILN: tl.constexpr, D: tl.constexpr, USE_DESC: tl.constexpr,
                    PREC: tl.constexpr, DP_FIRST: tl.constexpr, POLY: tl.constexpr, HOST_DESC: tl.constexpr):
    """The dq pass at L = 0 a query head a program (`kernel_bwd_rules.dq_heads`; G = GP): BM positions of
    head h, grid (cdiv(T, BM), B*Hq), the last blocks first. Its rows' lse2 and delta go to the folded
    buffers (row t*GP + g); a head's last block also writes +inf / 0 to its rows from T to RP // GP."""
    Hq = G * Hk
    t0 = (tl.num_programs(0) - 1 - tl.program_id(0)) * BM
    b, h = tl.program_id(1) // Hq, tl.program_id(1) % Hq
    j = h // G
    qdesc, dodesc, kdesc, vdesc = None, None, None, None
    if HOST_DESC:  # Q, DO, K, V: host-side descriptors
        qdesc, dodesc, kdesc, vdesc = Q, DO, K, V
    elif USE_DESC:  # boxes of BM positions x 1 head
        qdesc = rows_desc(Q, B, T, Hq, BM, 1, D)
        dodesc = rows_desc(DO, B, T, Hq, BM, 1, D)
        kdesc = keys_desc(K, B, T, Hk, BN, D)
        vdesc = keys_desc(V, B, T, Hk, BN, D)
    q = rows_tile(Q, qdesc, b, j, h % G, t0, T, G, Hq, 1, BM, D, USE_DESC)
    do = rows_tile(DO, dodesc, b, j, h % G, t0, T, G, Hq, 1, BM, D, USE_DESC)
    t = t0 + tl.arange(0, BM)
    optr, ok = rows_ptr(b, j, h % G, t, T, G, Hq, 1, D)
    lse = tl.load(LSE + (b * T + t).to(tl.int64) * Hq + h, mask=t < T, other=0.0)
    lse2 = tl.where(t < T, lse * 1.4426950408889634, float("inf"))
    delta = tl.sum(tl.load(O + optr, mask=ok, other=0.0).to(tl.float32) * do.to(tl.float32), 1)
    rows = (b * Hk + j) * RP + h % G
    tl.store(LSE2 + rows + t * GP, lse2, mask=t < T)
    tl.store(DELTA + rows + t * GP, delta, mask=t < T)
    if tl.program_id(0) == 0:
        tt = T + tl.arange(0, TAILN)
        tl.store(LSE2 + rows + tt * GP, tl.full([TAILN], float("inf"), tl.float32), mask=tt < RP // GP)
        tl.store(DELTA + rows + tt * GP, tl.zeros([TAILN], tl.float32), mask=tt < RP // GP)
    dq = dq_rows(q, do, lse2, delta, t, t0, K, V, kdesc, vdesc, b, j, T, Hk, qk_scale, BM, BM, BN, D, USE_DESC,
                 PREC, DP_FIRST, POLY)
    tl.store(DQ + optr, (dq * sm_scale).to(DQ.dtype.element_ty), mask=ok)


# the argument kv_chunk (a chunk length) shadows the rule kv_chunk re-exported above, which computes it
def moda_bwd_tma(do, q, k, v, kd, vd, o, lse, scale: float, G: int, *, q_block_m: int = 64, q_block_n: int = 64,
                 q_warps: int = 4, q_stages: int = 3, q_maxnreg: int = 0, kv_block_m: int = 64, kv_block_n: int = 64,
                 kv_warps: int = 4, kv_stages: int = 3, kv_maxnreg: int = 0, block_l: int = 0, depth_stages: int = 2,
                 use_desc: bool = True, depth_grad: bool = True, beside=None, mix: bool = False, kv_chunk: int = 0,  # noqa: F811
                 depth_items: bool = False, dp_first=None, kv_sub: int = 1, poly: int = 0, heads: bool = False,
                 one: bool = False, state=None, depth_into=None):
    """The folded backward's two launches (or one): returns (dq, dk, dv, dkd, dvd). q, k, v, o, do (and kd,
    vd unless None: L = 0) contiguous and, with use_desc, `kernel_fwd_tma.aligned`; the caller
    checks shapes. Row blocks smaller than GP are widened to GP.

    mix: the dq pass's row blocks heavy and light alternately, not heaviest first (`dq_mix`).
    kv_chunk: positions of rows a key-major program takes (a multiple of kv_block_n; 0: all of
    its key tile's; `kv_chunk` picks it), the chunks of a tile summed by the last to finish.
    depth_items (L > 0, kv_block_m = q_block_m, not beside): the depth part leaves the dq pass for
    items of the key-major grid (`depth_item`; off unless asked for, `kv_depth_items` says why).
    kv_sub: sub-groups of the key-major pass (a power of two dividing GP; not with beside or
    depth_items): a program takes GP // kv_sub heads of its key tile's rows, the sub-groups' dk,
    dv summed by the last to finish (`_kv_kernel`). 1 in every default: it gained a little at G=8
    and lost elsewhere (docs/DESIGN.md, "The Triton kernel").
    poly: `config.MoDAConfig.exp_poly`'s bits 2 (dq pass) and 4 (key-major pass): their sequence
    probabilities half on the FMA pipe (`exp2_mix`; 16-bit inputs only). heads (L = 0, G a power of
    two above 1): the dq pass a query head a program (`_dq_head_kernel`, `kernel_bwd_rules.dq_heads`).
    dp_first: (key-major pass, dq pass) booleans, each pass's dp product issued before its
    exponentials; None: the key-major pass by `kernel_bwd_rules.dp_first` of its register cap,
    the dq pass after.
    beside: None runs the dq pass, then the key-major pass on the rows' statistics it stored. A
    function beside(main, side) instead gets the two launches as callables, to run them
    concurrently (`streams.run_beside`): side() is the key-major pass computing its rows' lse2
    and delta itself (`row_stats`), main() the dq pass. Where the key-major grid leaves most of
    the GPU's program slots empty (short T), its long programs then share the SMs with the dq
    pass instead of running after it. one (not with beside): both passes in one launch
    (`_one_kernel`; `kernel_bwd_rules.kv_one_fits` says what it needs). Everything but the tensors
    is planned once per set of sizes and arguments (`kernel_bwd_rules.bwd_plan`, memoised): a call
    allocates the gradients, checks lse's alignment and launches. The rows' statistics (lse2, delta)
    live in a per-stream scratch buffer (`counters.scratch_views`): written and read inside the call.
    state: `counters.stream_state` of q's device where the caller has it (None: asked here).
    kd, vd may be strided views sharing one set of strides (e.g. slices along the slot axis of one
    model-wide (B, T, slots, Hk, d) buffer: head stride d, unit last stride; with use_desc every
    other stride a 16-byte multiple): read in place, their descriptors built with those strides.
    depth_into (with depth_grad, L > 0): (gk, gv) of kd's shape, one set of such strides for both
    (a model's depth gradient buffer): the depth gradients are added to them in the kernel
    (DEPTH_ACC: each entry's one owning program loads, adds in fp32, stores) and returned as dkd, dvd."""
    B, T, Hq, d = q.shape
    Hk, L = k.shape[2], 0 if kd is None else kd.shape[2]
    into = depth_into if depth_into is not None and depth_grad and L else None
    dstr = depth_strides(kd, into[0] if into else None) if L else None
    key = (q.dtype, do.dtype, None if kd is None else kd.dtype, B, T, Hq, Hk, d, L, G, q_block_m, q_block_n,
           q_warps, q_stages, q_maxnreg, kv_block_m, kv_block_n, kv_warps, kv_stages, kv_maxnreg, block_l,
           depth_stages, bool(use_desc), bool(depth_grad), bool(mix), kv_chunk, bool(depth_items), dp_first, kv_sub,
           2 if one else int(beside is not None), interpreting(), poly, bool(heads),
           bool(use_desc) and host_desc_bwd(T), dstr, into is not None)
    p = bwd_plan(key)
    lse2 = delta = lse  # the rows' statistics the dq blocks store for the key-major pass, where it reads them
    if state is None:
        state = stream_state(q.device)
    if not one or p.one_wait:
        lse2, delta = scratch_views(_STATS, q.device, ((B * Hk, p.RP), (B * Hk, p.RP)), state=state)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if into:  # the caller's buffers, added to in place
        dkd, dvd = into
    elif not p.depth_grad:
        dkd = dvd = None
    elif dstr is None:
        dkd, dvd = torch.empty_like(kd), torch.empty_like(vd)
    else:  # contiguous, whatever kd's strides
        dkd, dvd = (torch.empty(x.shape, device=x.device, dtype=x.dtype) for x in (kd, vd))
    kd_, vd_ = (kd, vd) if L else (k, v)  # never read at L = 0
    dkd_, dvd_ = (dkd, dvd) if p.depth_grad else (kd_, vd_)  # never written without depth_grad
    dq_in = (q, k, v, do, kd_, vd_, dkd_, dvd_)  # the dq pass's tensors (descriptors of them: `host_ins`)
    kv_in = (q, k, v, do, o)  # the key-major pass's (o read only beside the dq pass, for its row statistics)

    sargs = dstr or _NO_STRIDES  # the kernels' depth stride arguments (read only where STRIDED)
    made: list = []  # host_ins' answer, built at most once a call

    def host_ins():
        """(dq_in, kv_in) with host-side descriptors where the kernels take them: the views and boxes of
        their device-side builders (`descriptors`); built only where a kept launch has not seen these
        tensors' pointers (`CachedLaunch`'s descs), once for both passes."""
        if made:
            return made[0]
        gp, P, bl, kvP, kvGS, qBM = p.boxes
        od = rows_hdesc(o, kvP, gp) if beside is not None or one else o
        # one launch reads q, k, v, do through dq_in's descriptors (the same boxes): only its o is built
        kv_d = (q, k, v, do, od) if one else (rows_hdesc(q, kvP, kvGS), keys_hdesc(k, kv_block_n),
                                              keys_hdesc(v, kv_block_n), rows_hdesc(do, kvP, kvGS), od)
        qP, qG = (qBM, 1) if heads else (P, gp)
        dq_d = (rows_hdesc(q, qP, qG), keys_hdesc(k, q_block_n), keys_hdesc(v, q_block_n), rows_hdesc(do, qP, qG),
                *((depth_hdesc(x, B, T, max(L, 1), Hk, d, P, bl, dstr and dstr[:3]) if L and not heads else x)
                  for x in (kd_, vd_)),
                *((depth_hdesc(x, B, T, L, Hk, d, P, bl, dstr and dstr[3:]) if p.depth_grad else x)
                  for x in (dkd_, dvd_)))
        made.append((dq_d, kv_d))
        return made[0]

    if use_desc and (not p.boxes or p.n_depth):  # device-side builds (depth items build theirs with host ones too)
        ensure_allocator()
    # `CachedLaunch` keys: the plan's, where lse (the one tensor not checked by the caller nor
    # allocated here) is 16-byte aligned; else Triton's own path
    cached = use_desc and aligned16(lse)

    def with_descs(args_of):
        """(the launch's arguments with tensors, the callable giving them with descriptors or None)."""
        return args_of(dq_in, kv_in), (lambda: args_of(*host_ins())) if p.boxes else None

    def dq_pass():
        if heads:
            args, descs = with_descs(lambda di, ki: (di[0], di[1], di[2], o, di[3], lse, lse2, delta, dq,
                                                     scale * LOG2E, scale, B, T, G, Hk, p.RP))
            return _DQH_LAUNCH(p.dq_key if cached else None, p.dq_grid, args, p.dq_meta, descs)
        args, descs = with_descs(lambda di, ki: (di[0], di[1], di[2], di[4], di[5], o, di[3], lse, lse2, delta, dq,
                                                 di[6], di[7], scale * LOG2E, scale, B, T, L, max(L, 1), G, Hk, p.RP,
                                                 p.n_m, *sargs))
        _DQ_LAUNCH(p.dq_key if cached else None, p.dq_grid, args, p.dq_meta, descs)

    def chunk_buffers():
        """(partials, arrival counters) of a chunked or split key-major pass; lse2 twice (never read) else."""
        if not p.ws_n:
            return lse2, lse2
        return (scratch(_KV_COUNTERS, q.device, p.ws_n, state=state),
                arrival_counters(_KV_COUNTERS, q.device, p.cnt_n, state=state))

    def kv_pass(stats: bool):
        ws, cnt = chunk_buffers()
        args, descs = with_descs(lambda di, ki: (*ki, lse, lse2, delta, dk, dv, ws, cnt, kd_, vd_, dq, dkd_, dvd_,
                                                 scale * LOG2E, scale, B, T, L, max(L, 1), G, Hk, p.RP, p.nch,
                                                 p.n_items, p.n_tiles, p.n_depth, *sargs))
        _KV_LAUNCH(p.kv_keys[stats] if cached else None, p.kv_grid, args, p.kv_meta[stats], descs)

    if one:  # the dq blocks and the key-major items (`_one_kernel`; o through kv_in's where they compute statistics)
        ws, cnt = chunk_buffers()
        sync = arrival_counters(_ONE_COUNTERS, q.device, B * Hk + 1, state=state) if p.one_wait else cnt
        args, descs = with_descs(lambda di, ki: (di[0], di[1], di[2], di[4], di[5], o, ki[4], di[3], lse, lse2, delta,
                                                 dq, dk, dv, ws, cnt, sync, di[6], di[7], scale * LOG2E, scale, B, T,
                                                 L, max(L, 1), G, Hk, p.RP, p.n_m, p.nch, p.n_items, p.n_tiles,
                                                 *sargs))
        _ONE_LAUNCH(p.one_key if cached else None, p.one_grid, args, p.one_meta, descs)
    elif beside is None:
        dq_pass()
        kv_pass(False)
    else:
        beside(dq_pass, lambda: kv_pass(True))
    return dq, dk, dv, dkd, dvd


_NO_STRIDES = (0,) * 6


def depth_strides(kd, g):
    """(sb, st, sl) of kd and of the depth gradients g (None: contiguous, allocated here) as the
    kernels' STRIDED mode takes them, or None where both are contiguous (the kernels' own
    contiguous addressing: what every call without a strided view compiles and runs)."""
    if kd.is_contiguous() and (g is None or g.is_contiguous()):
        return None
    B, T, L, Hk, d = kd.shape

    def of(x):
        return (T * L * Hk * d, L * Hk * d, Hk * d) if x is None or x.is_contiguous() else tuple(x.stride()[:3])
    return (*of(kd), *of(g))


def heads_merged(x) -> bool:
    """Whether a (B, T, L, Hk, d) view's last two dimensions are one (Hk*d) row with unit stride: what the
    descriptor backward's depth addressing needs (any other strides are passed to it)."""
    return x.stride(-1) == 1 and (x.shape[-2] == 1 or x.stride(-2) == x.shape[-1])


def depth_layout(kd, vd, L: int, usable):
    """(kd, vd, usable) as `moda_bwd_tma` takes them: contiguous ones as they are; strided views
    sharing one set of strides with `heads_merged` rows (slices of one model-wide buffer) in place,
    usable None (the forward's answer was about contiguous tensors: ask again); else copies."""
    if L == 0 or (kd.is_contiguous() and vd.is_contiguous()):
        return kd, vd, usable
    if kd.stride() == vd.stride() and heads_merged(kd):
        return kd, vd, None
    return kd.contiguous(), vd.contiguous(), None


_DQ_LAUNCH, _DQH_LAUNCH, _KV_LAUNCH = CachedLaunch(_dq_kernel), CachedLaunch(_dq_head_kernel), CachedLaunch(_kv_kernel)
_ONE_LAUNCH = CachedLaunch(_one_kernel)
