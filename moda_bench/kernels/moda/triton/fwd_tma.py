"""The descriptor-load forward of the fused MoDA kernel (`MoDAConfig.fwd_depth = "tma"`): one
program per block of folded rows does the causal sequence loop and the depth phase under one
online softmax, every tile loaded through a tensor descriptor (the TMA copy engine on Hopper),
built on the host where Triton has them, else by each program (`descriptors`). Launched by `kernel.moda_fwd`
(through `moda_fwd_tma`); `experiments/fused_fwd_triton.py` times its variants (route A,
docs/DESIGN.md).

q (B,T,Hq,d); k, v (B,T,Hk,d); k_depth, v_depth (B,T,L,Hk,d) or None (L = 0), all contiguous.
Returns out (B,T,Hq,d) in q's dtype and lse (B,T,Hq) float32, natural log: what the pointer
kernels of `kernel_fwd` return, so the backward passes are the same.

Design:
* Rows are group-aware: for KV head j the G query heads are folded into the row axis,
  r = t*GP + g (GP = next_pow2(G); rows g >= G are padding, never stored). A program owns
  BLOCK_M rows = P = BLOCK_M/GP positions [t0, t0+P) of one (batch, KV head).
* Loads: Q as a [1, P, GP, d] box of the (B,T,Hq,d) tensor (reshaped to [BLOCK_M, d]), the
  sequence K/V tiles as [BLOCK_N, d] boxes of the (B*T, Hk*d) view, the depth tiles as
  [P, BL, d] boxes of the (B*T, L, Hk*d) view of k_depth (the P positions' depth entries
  l0..l0+BL-1). Boxes past an edge are zero-filled by the copy engine, and what they would
  add (keys past T, rows past T, entries past L) is masked. USE_DESC=False is the same
  arithmetic with masked pointer loads (the baseline of what the descriptors buy).
* Sequence phase: keys [0, n_full) lie wholly below the block's first position (no mask; this
  loop carries `warp_specialize` when asked), then the one or two diagonal tiles with the
  causal mask. POLY = 2 computes every second column's probabilities on the FMA pipe
  (`triton_utils.exp2_mix`): at d=64 a tile's exponentials cost the exponential unit as long as
  its two products cost the tensor cores.
* Depth phase (the same online softmax): the P positions are cut into NB = P/S sub-tiles of S
  positions (R = S*GP >= 16 rows, one tensor-core tile), and a batched product
  [NB, R, d] x [NB, d, S*BL] scores each sub-tile's rows against its own positions' BL depth
  columns of this step only; a block-diagonal mask keeps each row's own position. It runs
  after the sequence loop (default) or before it (DEPTH_FIRST), pipelined over the L/BL steps
  (DEPTH_STAGES).
* Schedule: one program per (row block, batch*KV head), heaviest row blocks first; or
  PERSISTENT: a grid of #SMs programs walking the same heaviest-first order.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from moda_bench.kernels.launch import CachedLaunch, cdiv, next_pow2
from moda_bench.kernels.moda.triton.descriptors import (  # noqa: F401
    aligned,
    depth_rows_desc,
    depth_rows_hdesc,
    descriptors_available,
    ensure_allocator,
    host_descriptors,
    keys_desc,
    keys_hdesc,
    rows_desc,
    rows_hdesc,
)
from moda_bench.kernels.moda.triton.utils import dot_precision, exp2_mix, launch_options, mm, mm_acc

LOG2E = 1.4426950408889634
NEG = tl.constexpr(-1.0e30)  # finite "minus infinity": padding rows stay finite


@triton.jit
def _seq_tile(q, acc, m_i, l_i, t, K, V, kdesc, vdesc, b, j, start_n, T, Hk, qk_scale,
              BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, USE_DESC: tl.constexpr, MASK: tl.constexpr,
              PREC: tl.constexpr, POLY: tl.constexpr):
    """Fold the BLOCK_N sequence keys from start_n into (acc, m_i, l_i); MASK: causal mask; POLY:
    `exp2_mix`'s share of the probabilities on the FMA pipe."""
    kn = start_n + tl.arange(0, BLOCK_N)
    if USE_DESC:
        k = kdesc.load([b * T + start_n, j * HEAD_DIM])
        v = vdesc.load([b * T + start_n, j * HEAD_DIM])
    else:
        offs_d = tl.arange(0, HEAD_DIM)
        ptr = ((b * T + kn).to(tl.int64) * Hk + j)[:, None] * HEAD_DIM + offs_d[None, :]
        k = tl.load(K + ptr, mask=(kn < T)[:, None], other=0.0)
        v = tl.load(V + ptr, mask=(kn < T)[:, None], other=0.0)
    qk = mm(q, tl.trans(k), PREC)
    if MASK:
        qk = tl.where(kn[None, :] <= t[:, None], qk * qk_scale, NEG)
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = exp2_mix(qk - m_new[:, None], POLY)
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = exp2_mix(qk * qk_scale - m_new[:, None], POLY)
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = mm_acc(p.to(v.dtype), v, acc, PREC)
    return acc, m_new, l_i


@triton.jit
def depth_phase(q, acc, m_i, l_i, KD, VD, kddesc, vddesc, b, j, t0, T, L, Hk, qk_scale,
                 GP: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, S: tl.constexpr,
                 BL: tl.constexpr, USE_DESC: tl.constexpr, PREC: tl.constexpr, DEPTH_STAGES: tl.constexpr):
    """Fold the L depth keys of each row's own position into (acc, m_i, l_i), BL per step."""
    P: tl.constexpr = BLOCK_M // GP
    NB: tl.constexpr = P // S
    R: tl.constexpr = S * GP
    C: tl.constexpr = S * BL  # columns of one sub-tile per step
    q3 = tl.reshape(q, (NB, R, HEAD_DIM))
    rr = tl.arange(0, R)[None, :, None]
    cc = tl.arange(0, C)[None, None, :]
    same_pos = (rr // GP) == (cc // BL)  # [1, R, C]: column c belongs to row rr's position
    offs_p = tl.arange(0, P)
    offs_l = tl.arange(0, BL)
    offs_d = tl.arange(0, HEAD_DIM)
    for l0 in tl.range(0, L, BL, num_stages=DEPTH_STAGES):
        if USE_DESC:
            kd = kddesc.load([b * T + t0, l0, j * HEAD_DIM])  # [P, BL, d]
        else:
            pos = t0 + offs_p
            ll = l0 + offs_l
            ptr = ((((b * T + pos).to(tl.int64) * L)[:, None, None] + ll[None, :, None]) * Hk + j) * HEAD_DIM \
                + offs_d[None, None, :]
            ok = (pos < T)[:, None, None] & (ll < L)[None, :, None]
            kd = tl.load(KD + ptr, mask=ok, other=0.0)
        kd3 = tl.reshape(kd, (NB, C, HEAD_DIM))
        s3 = mm(q3, tl.trans(kd3, 0, 2, 1), PREC) * qk_scale  # [NB, R, C]
        own = same_pos & ((l0 + cc % BL) < L)
        s3 = tl.where(own, s3, NEG)
        s = tl.reshape(s3, (BLOCK_M, C))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if USE_DESC:
            vd = vddesc.load([b * T + t0, l0, j * HEAD_DIM])
        else:
            vd = tl.load(VD + ptr, mask=ok, other=0.0)
        vd3 = tl.reshape(vd, (NB, C, HEAD_DIM))
        p3 = tl.reshape(p.to(vd3.dtype), (NB, R, C))
        pv = tl.reshape(mm(p3, vd3, PREC), (BLOCK_M, HEAD_DIM))
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _tile(pid_m, b, j, Q, K, V, KD, VD, O, LSE, qdesc, kdesc, vdesc, kddesc, vddesc, qk_scale, T, L, G, Hk, Hq,
          GP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, S: tl.constexpr,
          BL: tl.constexpr, USE_DESC: tl.constexpr, WS: tl.constexpr, DEPTH_FIRST: tl.constexpr,
          PREC: tl.constexpr, DEPTH_STAGES: tl.constexpr, POLY: tl.constexpr):
    """One block of BLOCK_M folded rows of (batch b, KV head j): both phases, then the epilogue."""
    P: tl.constexpr = BLOCK_M // GP
    t0 = pid_m * P
    rows = tl.arange(0, BLOCK_M)
    t = t0 + rows // GP
    g = rows % GP
    row_ok = (t < T) & (g < G)
    offs_d = tl.arange(0, HEAD_DIM)
    qrow = (b * T + t).to(tl.int64) * Hq + j * G + g  # flat (b, t, h) row of q / out / lse
    if USE_DESC:
        q = tl.reshape(qdesc.load([b, t0, j * G, 0]), (BLOCK_M, HEAD_DIM))
    else:
        q = tl.load(Q + qrow[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], NEG, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if DEPTH_FIRST:
        acc, m_i, l_i = depth_phase(q, acc, m_i, l_i, KD, VD, kddesc, vddesc, b, j, t0, T, L, Hk, qk_scale,
                                     GP, BLOCK_M, HEAD_DIM, S, BL, USE_DESC, PREC, DEPTH_STAGES)
    n_full = (t0 // BLOCK_N) * BLOCK_N  # keys below every row's position: no mask
    t_end = tl.minimum(t0 + P, T)
    for start_n in tl.range(0, n_full, BLOCK_N, warp_specialize=WS):
        acc, m_i, l_i = _seq_tile(q, acc, m_i, l_i, t, K, V, kdesc, vdesc, b, j, start_n, T, Hk, qk_scale,
                                  BLOCK_N, HEAD_DIM, USE_DESC, False, PREC, POLY)
    for start_n in range(n_full, t_end, BLOCK_N):
        acc, m_i, l_i = _seq_tile(q, acc, m_i, l_i, t, K, V, kdesc, vdesc, b, j, start_n, T, Hk, qk_scale,
                                  BLOCK_N, HEAD_DIM, USE_DESC, True, PREC, POLY)
    if not DEPTH_FIRST:
        acc, m_i, l_i = depth_phase(q, acc, m_i, l_i, KD, VD, kddesc, vddesc, b, j, t0, T, L, Hk, qk_scale,
                                     GP, BLOCK_M, HEAD_DIM, S, BL, USE_DESC, PREC, DEPTH_STAGES)
    acc = acc / l_i[:, None]
    lse = (m_i + tl.math.log2(l_i)) / 1.4426950408889634
    tl.store(O + qrow[:, None] * HEAD_DIM + offs_d[None, :], acc.to(O.dtype.element_ty), mask=row_ok[:, None])
    tl.store(LSE + qrow, lse, mask=row_ok)


@triton.jit(do_not_specialize=["T", "L", "n_mblocks", "n_tiles"])
def moda_fwd_tma_kernel(Q, K, V, KD, VD, O, LSE, qk_scale, B, T, L, LD, G, Hk, Hq, n_mblocks, n_tiles,
                          GP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          HEAD_DIM: tl.constexpr, S: tl.constexpr, BL: tl.constexpr, USE_DESC: tl.constexpr,
                          WS: tl.constexpr, DEPTH_FIRST: tl.constexpr, PERSISTENT: tl.constexpr,
                          PREC: tl.constexpr, DEPTH_STAGES: tl.constexpr, POLY: tl.constexpr,
                          HOST_DESC: tl.constexpr):
    """All inputs contiguous. LD = max(L, 1) sizes the depth descriptors (KD/VD alias K/V when
    L = 0; the depth loop then runs no step). Grid: (n_mblocks, B*Hk), or (programs,) when
    PERSISTENT; row blocks are visited heaviest (last) first. HOST_DESC: Q, K, V, KD, VD are host-side
    descriptors (`descriptors.host_descriptors`), not tensors."""
    P: tl.constexpr = BLOCK_M // GP
    qdesc = None
    kdesc = None
    vdesc = None
    kddesc = None
    vddesc = None
    if HOST_DESC:
        qdesc, kdesc, vdesc, kddesc, vddesc = Q, K, V, KD, VD
    elif USE_DESC:
        qdesc = rows_desc(Q, B, T, Hq, P, GP, HEAD_DIM)
        kdesc = keys_desc(K, B, T, Hk, BLOCK_N, HEAD_DIM)
        vdesc = keys_desc(V, B, T, Hk, BLOCK_N, HEAD_DIM)
        kddesc = depth_rows_desc(KD, B, T, LD, Hk, P, BL, HEAD_DIM)
        vddesc = depth_rows_desc(VD, B, T, LD, Hk, P, BL, HEAD_DIM)
    if PERSISTENT:
        n_bh = B * Hk
        for tile in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
            pid_m = n_mblocks - 1 - tile // n_bh
            bh = tile % n_bh
            _tile(pid_m, bh // Hk, bh % Hk, Q, K, V, KD, VD, O, LSE, qdesc, kdesc, vdesc, kddesc, vddesc, qk_scale,
                  T, L, G, Hk, Hq, GP, BLOCK_M, BLOCK_N, HEAD_DIM, S, BL, USE_DESC, WS, DEPTH_FIRST, PREC,
                  DEPTH_STAGES, POLY)
    else:
        pid_m = n_mblocks - 1 - tl.program_id(0)
        bh = tl.program_id(1)
        _tile(pid_m, bh // Hk, bh % Hk, Q, K, V, KD, VD, O, LSE, qdesc, kdesc, vdesc, kddesc, vddesc, qk_scale,
              T, L, G, Hk, Hq, GP, BLOCK_M, BLOCK_N, HEAD_DIM, S, BL, USE_DESC, WS, DEPTH_FIRST, PREC,
              DEPTH_STAGES, POLY)


# ----------------------------------------------------------------------------- host side

def depth_geometry(G: int, block_m: int, depth_sub: int = 0, block_l: int = 0):
    """(GP, P, S, BL) of a program of block_m rows: S positions per depth sub-tile (depth_sub, or
    0: the fewest whose S*GP rows fill a 16-row tensor-core tile), BL depth entries per position
    per step (block_l // S columns of a sub-tile, or 0: about 256 depth rows a step, P*BL, at most
    64 per position). ValueError for a geometry the kernel cannot take."""
    gp = next_pow2(G)
    if block_m < 16 or block_m % gp or block_m & (block_m - 1):
        raise ValueError(f"block_m={block_m} must be a power of two >= 16 and a multiple of GP={gp} (G={G})")
    P = block_m // gp
    S = depth_sub or min(P, max(1, 16 // gp))
    if P % S or S * gp < 16 or S & (S - 1):
        raise ValueError(f"depth_sub={depth_sub} invalid for G={G}, block_m={block_m}: need a power-of-two divisor "
                         f"of {P} positions with depth_sub*{gp} >= 16")
    bl = block_l // S if block_l else max(cdiv(16, S), min(64, max(1, 256 // P)))
    if bl < 1 or bl & (bl - 1) or S * bl < 16:
        raise ValueError(f"block_l={block_l} invalid for the descriptor forward at G={G}, block_m={block_m}: "
                         f"need a power-of-two multiple of depth_sub={S} and >= 16")
    return gp, P, S, bl


def default_block_l(G: int, block_m: int) -> int:
    """The depth columns per step (S*BL) that `depth_geometry` picks by itself."""
    _, _, S, bl = depth_geometry(G, block_m)
    return S * bl


_SMS: dict = {}


def num_sms(device) -> int:
    """Multiprocessors of a CUDA device (a torch.device, its string or None); 4 off CUDA (the
    interpreter's stand-in). Looked up once a device (a per-call path asks it)."""
    n = _SMS.get(device)
    if n is None:
        dev = torch.device(device) if device is not None else None
        n = 4
        if dev is not None and dev.type == "cuda":
            n = torch.cuda.get_device_properties(dev).multi_processor_count
        try:
            _SMS[device] = n
        except TypeError:  # pragma: no cover - an unhashable device argument
            pass
    return n


def moda_fwd_tma(q, k, v, kd, vd, scale: float, G: int, *, block_m: int = 128, block_n: int = 64,
                 num_warps: int = 8, num_stages: int = 3, depth_sub: int = 0, block_l: int = 0,
                 depth_stages: int = 2, use_desc: bool = True, ws: bool = False, persistent: bool = False,
                 depth_first: bool = False, maxnreg: int = 0, poly: int = 0):
    """The descriptor forward's launch: returns (out, lse). q, k, v (and kd, vd unless None: L = 0)
    contiguous and, with use_desc, `aligned`; the caller checks shapes (`validate.check_inputs`).
    maxnreg: registers a thread (0: the compiler's choice; ignored by the interpreter). poly: the
    sequence loop's `exp2_mix` share (0 or 2; `triton_utils.exp_poly_share`)."""
    B, T, Hq, d = q.shape
    Hk = k.shape[2]
    L = 0 if kd is None else kd.shape[2]
    if kd is None:
        kd, vd = k, v  # never read: the depth loop runs no step
    host = bool(use_desc) and host_descriptors()
    # descriptor loads: every pointer 16-byte aligned (the caller's `aligned`), so the shape and
    # the tile configuration fix the launch's specialisation (`CachedLaunch`)
    key = (q.dtype, kd.dtype, B, T, Hq, Hk, d, L, G, block_m, block_n, num_warps, num_stages, depth_sub, block_l,
           bool(ws), bool(depth_first), bool(persistent), depth_stages, maxnreg, poly, host, bool(use_desc), q.device)
    plan = _FWD_PLANS.get(key)
    if plan is None:
        plan = _fwd_plan(key)
    gp, P, bl, n_m, n_tiles, grid, launch_key, meta = plan
    o = torch.empty_like(q)
    lse = torch.empty((B, T, Hq), device=q.device, dtype=torch.float32)
    rest = (o, lse, scale * LOG2E, B, T, L, max(L, 1), G, Hk, Hq, n_m, n_tiles)
    descs = None
    if host:  # the same views and boxes as the kernel's device-side builders, built where a kept launch needs them
        LD = max(L, 1)
        descs = lambda: (rows_hdesc(q, P, gp), keys_hdesc(k, block_n), keys_hdesc(v, block_n),  # noqa: E731
                         depth_rows_hdesc(kd, B, T, LD, Hk, d, P, bl), depth_rows_hdesc(vd, B, T, LD, Hk, d, P, bl),
                         *rest)
    elif use_desc:
        ensure_allocator()
    _FWD_LAUNCH(launch_key, grid, (q, k, v, kd, vd, *rest), meta, descs)
    return o, lse


_FWD_PLANS: dict = {}  # `moda_fwd_tma`'s arguments but the tensors -> its launch's plan


def _fwd_plan(key: tuple) -> tuple:
    """(GP, P, BL, row blocks, tiles, grid, `CachedLaunch` key, meta) of a descriptor forward (memoised
    in _FWD_PLANS: an eager call builds no geometry, grid or constexpr dict)."""
    (dtype, ddtype, B, T, Hq, Hk, d, L, G, block_m, block_n, num_warps, num_stages, depth_sub, block_l, ws,
     depth_first, persistent, depth_stages, maxnreg, poly, host, use_desc, device) = key
    gp, P, S, bl = depth_geometry(G, block_m, depth_sub, block_l)
    n_m = cdiv(T, P)
    n_tiles = n_m * B * Hk
    grid = (min(n_tiles, num_sms(device)),) if persistent else (n_m, B * Hk)
    kw = dict(GP=gp, BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=d, S=S, BL=bl, USE_DESC=use_desc, WS=ws,
              DEPTH_FIRST=depth_first, PERSISTENT=persistent, PREC=dot_precision(dtype), DEPTH_STAGES=depth_stages,
              POLY=poly, HOST_DESC=host)
    # the kept launch's key: the plan's with the depth split as built (S, BL), less use_desc and the device
    launch_key = (dtype, ddtype, B, T, Hq, Hk, d, L, G, block_m, block_n, num_warps, num_stages, S, bl, ws, depth_first,
                  persistent, depth_stages, maxnreg, poly, host) if use_desc else None
    if len(_FWD_PLANS) >= 256:
        _FWD_PLANS.clear()
    # the launch options asked at Triton's launch: maxnreg depends on whether the interpreter runs
    plan = _FWD_PLANS[key] = (gp, P, bl, n_m, n_tiles, grid, launch_key,
                              lambda: dict(kw, **launch_options(num_warps, num_stages, maxnreg)))
    return plan


_FWD_LAUNCH = CachedLaunch(moda_fwd_tma_kernel)
