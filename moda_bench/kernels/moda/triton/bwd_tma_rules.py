"""Launch rules of the folded-row "tma" backward (`kernel_bwd_tma`), decided per call on the host:
whether the key-major pass runs beside the dq pass (`kv_beside`) or in one launch with it (`kv_one`,
`kv_one_fits`), how its key tiles' rows are cut
into chunks (`kv_chunk`, `kv_items`), whether the depth part runs as items of the key-major grid
(`kv_depth_items`, off unless asked for), the dq pass's block order (`dq_mix`), the order of
a step's products (`dp_first`) and whether the passes take host-side descriptors (`host_desc_bwd`).
Each rule states the reason it stands on and where docs/PERFORMANCE.md records its measurements
(the numbered changes); `MoDAConfig` fields override them (-1 means "by
the rule"; `dp_first` and `host_desc_bwd` have none: `moda_bwd_tma`'s kwarg, the process switch).
Also `moda_bwd_tma`'s plan (`bwd_plan`): its launches' grids, keys and constexprs for one set of
sizes and arguments, memoised, so that a call only allocates and launches.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from moda_bench.kernels.launch import cdiv, next_pow2
from moda_bench.kernels.moda.config import MoDAConfig, current_device_index, tma_block_l
from moda_bench.kernels.moda.triton.descriptors import host_descriptors
from moda_bench.kernels.moda.triton.fwd_tma import depth_geometry
from moda_bench.kernels.moda.triton.utils import dot_precision, exp_poly_share, launch_options

# The key-major pass runs beside the dq pass (bwd_kv_beside = -1) inside a CUDA graph capture,
# where the depth part makes the dq pass long (L > 0), its programs are short (G <= KV_BESIDE_MAX_G)
# and the key-major grid, B*Hk*cdiv(T, bwd_kv_block_n) programs, is at most KV_BESIDE_MAX_WAVES a
# multiprocessor: there the two passes share the SMs instead of the key-major grid running after a
# dq pass that leaves most of them idle. Eager calls keep the order: they are host-bound, and the
# second stream's events and switches cost host time. Larger G, L = 0 and longer T lose beside
# (docs/PERFORMANCE.md, change 14).
KV_BESIDE_MAX_WAVES, KV_BESIDE_MAX_G = 1.0, 8


def kv_beside(cfg: MoDAConfig, B: int, T: int, Hk: int, G: int, L: int, n_sms: int, capturing=None,
              chunk=None) -> bool:
    """Whether the "tma" backward runs its key-major pass beside the dq pass (cfg.bwd_kv_beside).
    capturing: whether a CUDA graph is being captured (None: ask torch, only where it matters).
    Its grid counts its chunks (chunk: `kv_chunk`'s answer, None: asked here): a chunked pass
    fills the SMs itself."""
    if cfg.bwd_kv_beside >= 0:
        return cfg.bwd_kv_beside == 1
    if chunk is None:
        chunk = kv_chunk(cfg, B, T, Hk, G, n_sms)
    grid = B * Hk * kv_items(T, cfg.bwd_kv_block_n, chunk)[0]
    if not (L > 0 and G <= KV_BESIDE_MAX_G and grid <= KV_BESIDE_MAX_WAVES * n_sms):
        return False
    if capturing is None:
        capturing = current_device_index() >= 0 and torch.cuda.is_current_stream_capturing()
    return bool(capturing)


# The dq pass visits its row blocks heavy and light alternately (MIX) instead of heaviest first
# where L > 0 and T <= DQ_MIX_MAX_T: a light block is mostly depth bytes, a heavy one mostly
# sequence math, and co-resident programs then overlap the two. Above DQ_MIX_MAX_T the
# heaviest-first order's short last programs matter more (docs/PERFORMANCE.md, change 15).
DQ_MIX_MAX_T = 8192


# The key-major pass cuts its key tiles' rows into chunks (bwd_kv_chunk = -1) where the heaviest
# tile's steps, cdiv(T, P), exceed KV_CHUNK_SLACK times a fair share: all tiles' steps over
# n_sms * KV_CHUNK_SLOTS program slots; chunks of about that share, at least KV_CHUNK_MIN_STEPS
# steps (a chunk's fp32 partials and the last one's sum cost about what a few steps do). A grid of
# one program a key tile is otherwise as long as its first tile (T=1024, Hk=8: 128 programs of up
# to 128 steps on 132 SMs, one program an SM). Where the grid is not short, forced chunks only add
# the partials' cost; chunks below the minimum lost at G=1 (docs/PERFORMANCE.md, change 17).
KV_CHUNK_SLOTS, KV_CHUNK_SLACK, KV_CHUNK_MIN_STEPS = 2, 1.5, 16


def kv_chunk(cfg: MoDAConfig, B: int, T: int, Hk: int, G: int, n_sms: int) -> int:
    """Positions of rows a key-major program takes (`_kv_kernel`'s CHUNK; 0: all of its tile's):
    cfg.bwd_kv_chunk key tiles' width where >= 0, else the fair share of steps a program slot
    (KV_CHUNK_SLOTS an SM) where the heaviest tile has more than KV_CHUNK_SLACK times it."""
    key = (cfg.bwd_kv_chunk, cfg.bwd_kv_block_n, cfg.bwd_kv_block_m, B, T, Hk, G, n_sms)
    got = _KV_CHUNK_MEMO.get(key)
    if got is None:
        if len(_KV_CHUNK_MEMO) > 4096:  # variable-length callers
            _KV_CHUNK_MEMO.clear()
        got = _KV_CHUNK_MEMO[key] = _kv_chunk(cfg, B, T, Hk, G, n_sms)
    return got


_KV_CHUNK_MEMO: dict = {}  # kv_chunk's answers (a dict look-up a backward call)


def _kv_chunk(cfg: MoDAConfig, B: int, T: int, Hk: int, G: int, n_sms: int) -> int:
    bn = cfg.bwd_kv_block_n
    if cfg.bwd_kv_chunk >= 0:
        chunk = cfg.bwd_kv_chunk * bn
    else:
        p = max(cfg.bwd_kv_block_m, next_pow2(G)) // next_pow2(G)
        n_tiles = cdiv(T, bn)
        steps = B * Hk * (n_tiles * T - bn * n_tiles * (n_tiles - 1) // 2) / p
        fair = steps / (n_sms * KV_CHUNK_SLOTS)
        if cdiv(T, p) <= KV_CHUNK_SLACK * fair:
            return 0
        chunk = max(cdiv(KV_CHUNK_MIN_STEPS * p, bn) * bn, int(fair * p) // bn * bn)
    return chunk if 0 < chunk < T else 0


# Both passes in one launch (bwd_kv_beside = 2, `kernel_bwd_tma._one_kernel`; -1: in eager calls,
# not in a CUDA graph capture, where L > 0, T <= KV_ONE_MAX_T and `kv_one_fits`): a launch and its
# host work fewer a call, which pays where eager calls are host-bound (short T); under a graph the
# GPU time decides and the two launches stay. The key-major items first, computing their rows'
# statistics themselves (ONE_WAIT = False), make every step dearer and lost under the graph
# (docs/PERFORMANCE.md, change 45).
KV_ONE_MAX_T = 1024
ONE_WAIT = True  # the one launch's order: dq blocks first, key-major items wait for their rows' statistics


ONE_OPTS = ("block_m", "block_n", "warps", "stages", "maxnreg")  # what both passes of one launch share


def pass_options(cfg: MoDAConfig) -> tuple:
    """((block_m, block_n, warps, stages, maxnreg) of the dq pass, the same of the key-major pass) of cfg."""
    return tuple(tuple(getattr(cfg, f"bwd_{p}_{n}") for n in ONE_OPTS) for p in ("q", "kv"))


def kv_one_fits(q_opts: tuple, kv_opts: tuple, heads: bool = False, items: bool = False, sub: int = 1) -> str:
    """Why the two passes cannot share one launch ('' where they can): the same tiles, warps, stages
    and register cap (`pass_options`), no dq pass a head a program, no depth items, no sub-groups."""
    why = [f"bwd_q_{n}={a} != bwd_kv_{n}={b}" for n, a, b in zip(ONE_OPTS, q_opts, kv_opts) if a != b]
    why += [w for w, on in (("a dq pass a query head a program", heads), ("depth items", items),
                            ("key-major sub-groups", sub > 1)) if on]
    return "; ".join(why)


def kv_one(cfg: MoDAConfig, T: int, L: int, heads: bool = False, items: bool = False, capturing=None) -> bool:
    """Whether the "tma" backward runs both passes in one launch: cfg.bwd_kv_beside == 2, or -1 where
    L > 0, T <= KV_ONE_MAX_T, `kv_one_fits` and no CUDA graph is being captured (capturing: None
    asks torch, only where the rest holds)."""
    if cfg.bwd_kv_beside >= 0:
        return cfg.bwd_kv_beside == 2
    if not (L > 0 and T <= KV_ONE_MAX_T) or kv_one_fits(*pass_options(cfg), heads, items):
        return False
    if capturing is None:
        capturing = current_device_index() >= 0 and torch.cuda.is_current_stream_capturing()
    return not capturing


def kv_items(T: int, block_n: int, chunk: int) -> tuple:
    """(programs per (batch, KV head), chunks NCH) of the key-major grid (`chunk_item`)."""
    n_tiles = cdiv(T, block_n)
    if not chunk:
        return n_tiles, 1
    tpc, nch = chunk // block_n, cdiv(T, chunk)
    return tpc * nch * (nch + 1) // 2 - (tpc * nch - n_tiles), nch


# The depth part as items of the key-major grid (bwd_depth_items = 1; -1 leaves it off; the tuner
# tries it). The merged kernel takes more registers than the key pass alone: two programs an SM
# either way, and the depth part, which in the dq pass reaches the copy rate only with both slots
# of every SM loading, gets one of them beside a key item: its bytes take as long again and
# nothing overlaps (docs/PERFORMANCE.md, change 18).


def kv_depth_items(cfg: MoDAConfig, T: int, L: int, G: int) -> bool:
    """Whether the "tma" backward runs its depth part as items of the key-major grid (`depth_item`):
    cfg.bwd_depth_items == 1 at L > 0 (-1 and 0: in the dq pass; T and G do not decide it yet)."""
    return L > 0 and cfg.bwd_depth_items == 1


# The dq pass at L = 0 a query head a program (`_dq_head_kernel`: BM positions of one head, not BM
# folded rows of P positions x GP heads) where G is a power of two above 1 and T >= DQ_HEADS_MIN_T
# (G = 2: DQ_HEADS_MIN_T_G2). Its 64 x 64 tiles take 122 registers a thread, no spill, 4 programs an
# SM; the folded pass needs its 168 (capped at 128 it spills). Below the minimum T (for G = 2,
# below DQ_HEADS_MIN_T_G2) the folded pass stays ahead (docs/PERFORMANCE.md, change 41).
DQ_HEADS_MIN_T, DQ_HEADS_MIN_T_G2 = 1024, 8192


def dq_heads_possible(L: int, G: int) -> bool:
    """Whether a dq pass a query head a program can run: L = 0, G a power of two above 1 (no padding heads)."""
    return not L and G >= 2 and not G & (G - 1)


def dq_heads(cfg: MoDAConfig, T: int, L: int, G: int) -> bool:
    """Whether the "tma" backward's dq pass runs a query head a program (cfg.bwd_dq_heads 1 / 0; -1:
    by T and G, above); only where `dq_heads_possible`."""
    if not dq_heads_possible(L, G):
        return False
    if cfg.bwd_dq_heads >= 0:
        return bool(cfg.bwd_dq_heads)
    return T >= (DQ_HEADS_MIN_T if G > 2 else DQ_HEADS_MIN_T_G2)


def dq_mix(T: int, L: int) -> bool:
    """Whether the dq pass alternates heavy and light row blocks (`_dq_kernel`'s MIX)."""
    return L > 0 and T <= DQ_MIX_MAX_T


# The backward's passes take host-side tensor descriptors (`descriptors`) where T <= HOST_DESC_BWD_MAX_T;
# above it they build theirs on the device: there the passes are capped at 168 registers and spill
# more with the descriptors' parameters, while the device-side builds are a small share of long
# programs. The forward takes them at every T (docs/PERFORMANCE.md, change 42).
HOST_DESC_BWD_MAX_T = 8192


def host_desc_bwd(T: int) -> bool:
    """Whether the "tma" backward's passes take host-side descriptors at sequence length T."""
    return T <= HOST_DESC_BWD_MAX_T and host_descriptors()


# The key-major pass's step issues its dp^T product (v do^T) before the exponentials of its
# scores, so the tensor cores compute it while the exponential unit works, where its registers
# are not capped; with the cap (168 at T > 4096) the two score-sized fp32 tiles live at once and
# the pass spills; uncapping it to issue dp first was no faster. The dq pass keeps dp after: it
# gains nothing there. Gradients are bitwise the same either way (docs/PERFORMANCE.md, change 20).
def dp_first(maxnreg: int) -> bool:
    """Whether the key-major pass, with this register cap (0: none), issues dp^T before the exponentials."""
    return maxnreg == 0


def bwd_depth_geometry(G: int, block_m: int, L: int, block_l: int = 0):
    """(GP, P, S, BL) of a query-major program of block_m rows (`kernel_fwd_tma.depth_geometry`;
    block_l 0: about 128 depth rows a step, at most 32 columns, `config.tma_block_l`), BL at most
    next_pow2(L) unless a 16-column tile needs more."""
    gp, P, S, bl = depth_geometry(G, block_m, 0, block_l or tma_block_l(G, block_m, 128, 32))
    return gp, P, S, max(cdiv(16, S), min(bl, next_pow2(max(L, 1))))


class BwdPlan(NamedTuple):
    """What `moda_bwd_tma` launches for one set of sizes and arguments, but the tensors."""
    RP: int
    n_m: int
    depth_grad: bool
    dq_key: tuple
    dq_grid: tuple
    dq_meta: Callable
    kv_keys: tuple
    kv_grid: tuple
    kv_meta: tuple
    ws_n: int
    cnt_n: int
    nch: int
    n_items: int
    n_tiles: int
    n_depth: int
    boxes: tuple  # host-side descriptors' boxes: GP, dq positions, BL, key-major positions and heads, dq rows; or ()
    one_key: tuple = None  # both passes in one launch (`_one_kernel`): its key, grid and constexprs, else None
    one_grid: tuple = ()
    one_meta: Callable = None
    one_wait: bool = False  # its key-major items wait for the dq blocks' row statistics (`ONE_WAIT`)


def _make_plan(dtype, do_dtype, kd_dtype, B, T, Hq, Hk, d, L, G, q_block_m, q_block_n, q_warps, q_stages, q_maxnreg,
               kv_block_m, kv_block_n, kv_warps, kv_stages, kv_maxnreg, block_l, depth_stages, use_desc, depth_grad,
               mix, kv_chunk, depth_items, dp_order, kv_sub, beside, interp, poly, heads, host, dstr=None,
               acc=False) -> BwdPlan:
    """`moda_bwd_tma`'s launches for its key (ValueError for arguments the kernels cannot take).
    dstr: the depth tensors' strides where strided (`bwd_tma.depth_strides`: the kernels' STRIDED
    mode, and part of every launch key: host-side descriptors are kept by pointer); acc: the depth
    gradients added into the caller's buffers (DEPTH_ACC)."""
    gp = next_pow2(G)
    if heads and not dq_heads_possible(L, G):
        raise ValueError(f"a dq pass a query head a program needs L = 0 and G a power of two above 1 (L={L}, G={G})")
    q_block_m, kv_block_m = max(q_block_m, gp), max(kv_block_m, gp)
    _, P, S, bl = bwd_depth_geometry(G, q_block_m, L, block_l)
    depth_grad = depth_grad and L > 0
    n_m = cdiv(T, q_block_m // gp)
    if kv_sub < 1 or gp % kv_sub or kv_sub & (kv_sub - 1) or (kv_sub > 1 and (beside or depth_items)):
        raise ValueError(f"kv_sub={kv_sub} must be a power of two dividing GP={gp}, without beside or depth_items")
    tail = kv_block_m * kv_sub  # rows after the dq blocks that the key-major pass's last steps read
    RP = n_m * q_block_m + tail  # a multiple of 16: the kernels know the rows' alignment
    prec = dot_precision(dtype)  # (the interpreter's "upcast": interp is in the key)
    q_poly, kv_poly = exp_poly_share(poly, 2, dtype), exp_poly_share(poly, 4, dtype)
    kv_dp_first, q_dp_first = (dp_first(kv_maxnreg), False) if dp_order is None else dp_order
    depth_items = depth_items and L > 0
    if depth_items and (kv_block_m != q_block_m or beside):
        raise ValueError("depth_items needs kv_block_m = q_block_m and the key-major pass after the dq pass")
    if kv_chunk and (kv_chunk % kv_block_n or kv_chunk < 0):
        raise ValueError(f"kv_chunk={kv_chunk} is not a positive multiple of kv_block_n={kv_block_n}")
    n_tiles = cdiv(T, kv_block_n)
    n_items, nch = kv_items(T, kv_block_n, kv_chunk)
    chunk = kv_chunk if nch > 1 else 0
    n_depth = n_m if depth_items else 0  # depth items: the dq pass's row blocks (kv_block_m = q_block_m)
    # the launches' specialisation: every tensor of q's dtype but the fp32 row statistics and
    # partials, every pointer 16-byte aligned (the caller's `aligned`; lse checked per call)
    shape_key = (dtype, do_dtype, kd_dtype, B, T, Hq, Hk, d, L, G, q_block_m, kv_block_m, S, bl, depth_grad, prec,
                 depth_stages, kv_sub, host, dstr, acc)
    depth_modes = dict(DEPTH_ACC=bool(acc) and depth_grad, STRIDED=dstr is not None)
    dq_meta = dict(GP=gp, BM=q_block_m, BN=q_block_n, TAIL=tail, D=d, S=S, BL=bl, DEPTH=L > 0 and not depth_items,
                   DEPTH_GRAD=depth_grad, USE_DESC=use_desc, PREC=prec, DEPTH_STAGES=depth_stages, MIX=mix,
                   DP_FIRST=bool(q_dp_first), POLY=q_poly, HOST_DESC=host, **depth_modes,
                   **launch_options(q_warps, q_stages, q_maxnreg))
    kv_meta = tuple(dict(GP=gp, BM=kv_block_m, BN=kv_block_n, D=d, USE_DESC=use_desc, PREC=prec, STATS=stats,
                         CHUNK=chunk, DEPTH_ITEMS=depth_items, S=S, BL=bl, DEPTH_STAGES=depth_stages,
                         DEPTH_GRAD=depth_grad, DP_FIRST=bool(kv_dp_first), NSUB=kv_sub, POLY=kv_poly, HOST_DESC=host,
                         **depth_modes, **launch_options(kv_warps, kv_stages, kv_maxnreg)) for stats in (False, True))
    dq_grid = (B * Hk, n_m)
    if heads:  # BM positions of one head a program; rows from T to RP // GP: +inf / 0 (`_dq_head_kernel`)
        dq_meta = dict(GP=gp, BM=q_block_m, BN=q_block_n, TAILN=next_pow2(max(1, RP // gp - T)), D=d,
                       USE_DESC=use_desc, PREC=prec, DP_FIRST=bool(q_dp_first), POLY=q_poly, HOST_DESC=host,
                       **launch_options(q_warps, q_stages, q_maxnreg))
        dq_grid = (cdiv(T, q_block_m), B * Hq)
    split = chunk or kv_sub > 1
    one = None
    if beside == 2:
        why = kv_one_fits((q_block_m, q_block_n, q_warps, q_stages, q_maxnreg),
                          (kv_block_m, kv_block_n, kv_warps, kv_stages, kv_maxnreg), heads, depth_items, kv_sub)
        if why:
            raise ValueError(f"both backward passes in one launch need the same tiles and options: {why}")
        one_meta = dict(GP=gp, BM=q_block_m, BN=q_block_n, D=d, S=S, BL=bl, DEPTH=L > 0, DEPTH_GRAD=depth_grad,
                        USE_DESC=use_desc, PREC=prec, DEPTH_STAGES=depth_stages, MIX=mix, DP_FIRST=bool(q_dp_first),
                        POLY=q_poly, CHUNK=chunk, KV_DP_FIRST=bool(kv_dp_first), KV_POLY=kv_poly, HOST_DESC=host,
                        TAIL=tail, WAIT=ONE_WAIT, **depth_modes, **launch_options(q_warps, q_stages, q_maxnreg))
        one = ((shape_key, "one", q_block_n, mix, bool(q_dp_first), bool(kv_dp_first), chunk, q_warps, q_stages,
                q_maxnreg, q_poly, kv_poly, ONE_WAIT), (B * Hk, n_items + n_m), lambda: dict(one_meta), ONE_WAIT)
    return BwdPlan(RP, n_m, depth_grad,
                   (shape_key, q_block_n, mix, bool(q_dp_first), depth_items, q_warps, q_stages, q_maxnreg, q_poly,
                    heads),
                   dq_grid, lambda: dict(dq_meta),
                   tuple((shape_key, kv_block_n, stats, chunk, depth_items, bool(kv_dp_first), kv_warps, kv_stages,
                          kv_maxnreg, kv_poly) for stats in (False, True)),
                   (B * Hk * kv_sub, n_items + n_depth), tuple((lambda m=m: dict(m)) for m in kv_meta),
                   B * Hk * kv_sub * n_items * 2 * kv_block_n * d if split else 0, B * Hk * n_tiles if split else 0,
                   nch, n_items, n_tiles, n_depth,
                   (gp, P, bl, kv_block_m * kv_sub // gp, gp // kv_sub, q_block_m) if host else (),
                   *(one or (None, (), None, False)))


_PLANS: dict = {}


def bwd_plan(key: tuple) -> BwdPlan:
    """`moda_bwd_tma`'s plan for its key (memoised; ValueError for arguments the kernels cannot take)."""
    p = _PLANS.get(key)
    if p is None:
        p = _make_plan(*key)
        if len(_PLANS) >= 256:
            _PLANS.clear()
        _PLANS[key] = p
    return p
