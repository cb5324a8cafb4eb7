"""The MoDA decode operator: `moda_decode` (flash-decoding in Triton), its tile settings
(`DecodeConfig`) and the split chooser (`choose_num_splits`). The kernels live in
`kernel_split`.

One call is at most two launches:
1. `decode_split_kernel`, grid (B*Hk, row_blocks * S): each (sequence, KV head) has its cache
   cut into S contiguous spans, one program per span; the rows of a program's tile are the
   Tq*G query rows of its KV head (padded to a power of two >= 16; more than
   `config.max_rows` rows are cut into row blocks), so the cache is read once per KV head. The
   last split also takes the new tokens' depth entries. Each writes an fp32 partial (o, lse).
2. `decode_combine_kernel`, grid (B*Tq*Hq,): merges a row's partials by log-sum-exp into the
   output (one softmax over cache and depth in the end). With `DecodeConfig(fused_combine=True)`
   this launch is not made: the last split program of each row block merges its rows' partials
   (an int32 arrival counter per row block: every program adds 1 after storing its partial,
   acq_rel at gpu scope; the one that sees S - 1 runs the combine's `merge_row` over its rows
   and puts the counter back to 0), so the call is one launch. The counters are
   a persistent buffer, zeroed once and cached per (device, stream, size) (`_counters`: what
   streams and CUDA graphs may share one).
With S = 1 the split kernel writes the output directly and there is no second launch. With
`DecodeConfig(pdl=True)` (not with fused_combine) the combine launch uses Programmatic Dependent
Launch on CUDA devices of compute capability >= 9 (`_pdl_active`; elsewhere and under the
interpreter the knob does nothing): the split programs let it be scheduled while they run, and
it waits (griddepcontrol.wait) for the whole split grid, its stores flushed, before it reads a
partial.

Host work per call: the input checks (shapes, dtypes; values only where reading them costs no
device sync, see `check_decode_inputs`), two small allocations (partials), the launches (the
fused combine's counters are allocated by the first call of their size only). The
grid comes from the cache capacity Tk, never from cache_seqlens' values: programs whose span
lies past n_b load nothing and store nothing (under the fused combine they still arrive at
their counter, once, and the merge skips their partials as the combine kernel does).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Optional

import torch

from moda_bench.kernels.counters import arrival_counters
from moda_bench.kernels.decode.fwd_split import decode_combine_kernel, decode_split_kernel
from moda_bench.kernels.decode.validate import MAX_SPLITS, DecodeShape, check_decode_inputs
from moda_bench.kernels.launch import CachedLaunch, aligned16, cdiv, next_pow2
from moda_bench.kernels.moda.triton.utils import dot_precision, interpreting
from moda_bench.kernels.oplib import config_key, config_of, through_ops

LOG2E = 1.4426950408889634
CPU_SM_COUNT = 132  # what the chooser assumes off CUDA (an H100 SXM / H200)
WAVES = 2  # programs the chooser aims for, in multiples of the SM count
MIN_SPLIT_BLOCKS = 4  # a split gets at least this many BLOCK_N tiles of keys


@dataclass(frozen=True)
class DecodeConfig:
    """Tile settings of the decode kernels (all powers of two except the warp/stage counts).

    block_n: cache keys per tile (None: 128 for d <= 64, 64 for d = 128, so a K or V tile is
    16 KiB in bf16); num_warps, num_stages: of the split kernel (num_stages tiles in flight;
    `default_config` changes them per GPU where measured); block_l: depth entries per tile;
    max_rows: rows of one program (Tq*G beyond it are cut into row blocks, each reading the
    cache again); combine_warps: of the combine kernel; combine_block_s: splits merged per step
    (None: up to 4096 // d). tma: read a dense cache's tiles through tensor descriptors (TMA on
    Hopper; paged caches and layouts a descriptor cannot take keep pointer loads).
    fused_combine: with S > 1, the last split program of each row block merges the partials
    itself (an int32 arrival counter per row block, `_counters`; the merge is the combine
    kernel's `merge_row`, row by row, combine_block_s splits a step), so one call is one launch.
    Off by default: the last program merges all S partials alone, a serial tail that grows with
    the split count and costs more at long caches than the launch it saves; the shared row-by-row
    merge and a two-pass merge of the block's rows at once were slower still (docs/DESIGN.md,
    "Decode"). A graph capture takes the counters an eager call allocated, so no zero-fill node
    runs before the kernel at every replay.
    pdl: launch the combine kernel with Programmatic Dependent Launch (calls with S > 1 and the
    combine as its own launch): it is scheduled while the split kernel runs and waits, before
    it reads a partial, until every split program has finished and its stores are visible, so
    its launch gap hides under the split's run. It takes effect only on CUDA devices of compute
    capability >= 9 (Hopper on) and not under TRITON_INTERPRET; elsewhere it is silently a no-op
    (the kernels and launches of pdl=False). Not with fused_combine (one launch already:
    ValueError). Off by default; on in the H100's and H200's GPU_TILES, where it was measured
    (experiments/decode_probe.py --pdl; docs/DESIGN.md, "Decode")."""

    block_n: int | None = None
    num_warps: int = 4
    num_stages: int = 3
    block_l: int = 64
    max_rows: int = 64
    combine_warps: int = 4
    combine_block_s: int | None = None
    tma: bool = False
    fused_combine: bool = False
    pdl: bool = False

    def resolved(self, d: int) -> "DecodeConfig":
        """The config with its automatic fields filled in for head dim d, checked."""
        cfg = self if self.block_n is not None else replace(self, block_n=128 if d <= 64 else 64)
        for name in ("block_n", "block_l", "max_rows"):
            val = getattr(cfg, name)
            if not isinstance(val, int) or val < 16 or val & (val - 1):
                raise ValueError(f"DecodeConfig.{name}={val!r} must be a power of two >= 16")
        cbs = cfg.combine_block_s
        if cbs is not None and (cbs < 1 or cbs & (cbs - 1)):
            raise ValueError(f"DecodeConfig.combine_block_s={cfg.combine_block_s!r} must be a power of two")
        for name in ("num_warps", "combine_warps"):
            if getattr(cfg, name) not in (1, 2, 4, 8, 16):
                raise ValueError(f"DecodeConfig.{name}={getattr(cfg, name)!r} must be one of 1, 2, 4, 8, 16")
        if not isinstance(cfg.num_stages, int) or cfg.num_stages < 1:
            raise ValueError(f"DecodeConfig.num_stages={cfg.num_stages!r} must be an int >= 1")
        if cfg.pdl and cfg.fused_combine:
            raise ValueError("DecodeConfig.pdl=True needs fused_combine=False (the fused combine is one launch: "
                             "there is no combine launch to overlap)")
        return cfg


DEFAULT_CONFIG = DecodeConfig()

# Split-kernel tiles that beat DEFAULT_CONFIG on a GPU, by a substring of its device name, for
# calls of at least `min_heads` (sequence, KV head) pairs B*Hk, chosen from experiments/decode_probe.py
# grids and decode preset runs against cuDNN at L=0 (the measurements: docs/DESIGN.md, "Decode").
# H100: 2 warps, 2 stages (two 16 KiB stages leave shared memory for more programs per SM).
# H200: the same tiles only for large calls (B*Hk >= 1024); with fewer programs its faster HBM
# wants more bytes in flight per program. The H200 reads through tensor descriptors (tma), which
# won its whole block_n=128 grid; on the H100 they were level with pointer loads, so it keeps
# pointers. Both launch the combine with PDL (`pdl`; outputs bitwise equal). The first entry that
# matches a device name and call size is taken.
GPU_TILES: tuple = (("H100", {"num_warps": 2, "num_stages": 2, "pdl": True}, 0),
                    ("H200", {"num_warps": 2, "num_stages": 2, "tma": True, "pdl": True}, 1024),
                    ("H200", {"tma": True, "pdl": True}, 0))


@functools.lru_cache(maxsize=256)
def _gpu_config(name: str, heads: int = 0) -> DecodeConfig:
    for key, fields, min_heads in GPU_TILES:
        if key in name and heads >= min_heads:
            return replace(DEFAULT_CONFIG, **fields)
    return DEFAULT_CONFIG


def default_config(device: torch.device, heads: int = 0) -> DecodeConfig:
    """The config `moda_decode` runs when none is given, for a call of `heads` = B*Hk (sequence,
    KV head) pairs: DEFAULT_CONFIG with the GPU_TILES entry of `device`'s name where it applies
    (DEFAULT_CONFIG off CUDA and on GPUs without an entry)."""
    if device.type != "cuda":
        return DEFAULT_CONFIG
    return _gpu_config(_device_name(_index(device)), heads)


def _index(device: torch.device) -> int:
    """The CUDA device's index (the current device for a bare 'cuda')."""
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def _device_name(index) -> str:
    return torch.cuda.get_device_name(index)


@functools.lru_cache(maxsize=256)
def _resolved(cfg: DecodeConfig, d: int) -> DecodeConfig:
    """Memoised `cfg.resolved(d)` (keeps the per-call host work small)."""
    return cfg.resolved(d)


def choose_num_splits(B: int, Hk: int, Tk: int, n_sm: int, block_n: int) -> int:
    """Splits per (sequence, KV head) for a cache of Tk positions: as many as keep the B*Hk*S
    programs within WAVES (2) waves of the n_sm SMs, so the GPU is full without a ragged extra
    wave (floor(2*n_sm / (B*Hk))), but no split shorter than MIN_SPLIT_BLOCKS (4) tiles of
    block_n keys, at least 1 and at most MAX_SPLITS. B*Hk >= 2*n_sm gives 1 (no split).

    >>> choose_num_splits(1, 8, 32768, 132, 64)   # 8 programs alone would use 8 of 132 SMs
    33
    >>> choose_num_splits(8, 8, 32768, 132, 64)
    4
    >>> choose_num_splits(64, 8, 32768, 132, 64)  # 512 programs already fill ~4 waves
    1
    """
    for name, val in (("B", B), ("Hk", Hk), ("Tk", Tk), ("n_sm", n_sm), ("block_n", block_n)):
        if not isinstance(val, int) or val < 1:
            raise ValueError(f"choose_num_splits: {name} must be a positive int, got {val!r}")
    want = (WAVES * n_sm) // (B * Hk)
    cap = cdiv(Tk, block_n) // MIN_SPLIT_BLOCKS
    return max(1, min(want, cap, MAX_SPLITS))


@functools.lru_cache(maxsize=None)
def _sm_count(device_index) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; CPU_SM_COUNT off CUDA (the interpreter)."""
    if device.type != "cuda":
        return CPU_SM_COUNT
    return _sm_count(_index(device))


@functools.lru_cache(maxsize=None)
def _capability(device_index) -> tuple:
    return torch.cuda.get_device_capability(device_index)


def _pdl_active(device: torch.device) -> bool:
    """Whether `DecodeConfig.pdl` takes effect on device: CUDA, compute capability >= 9 (PDL
    and griddepcontrol need sm_90), not under the interpreter."""
    if device.type != "cuda" or interpreting():
        return False
    return _capability(_index(device))[0] >= 9


def resolve_num_splits(num_splits, shape: DecodeShape, cfg: DecodeConfig, device: torch.device) -> int:
    """The S a call runs: num_splits checked (an int in [1, MAX_SPLITS]) or, for None, the chooser's."""
    if num_splits is None:
        return choose_num_splits(shape.B, shape.Hk, shape.Tk, sm_count(device), cfg.block_n)
    if isinstance(num_splits, bool) or not isinstance(num_splits, int):
        raise TypeError(f"num_splits must be an int or None, got {type(num_splits).__name__}")
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits={num_splits} must be in [1, {MAX_SPLITS}] (or None to choose)")
    return num_splits


def _last_dim_contiguous(t):
    return t if t is None or t.stride(-1) == 1 else t.contiguous()


def _descriptors(k, v, block_n: int):
    """Tensor descriptors of the dense caches (B, Tk, Hk, d), block (1, block_n, 1, d); (None, None)
    where this Triton has none or a cache's strides are not 16-byte multiples (TMA's rule)."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:
        return None, None
    for t in (k, v):
        if any((st * t.element_size()) % 16 for st in t.stride()[:-1]) or t.data_ptr() % 16:
            return None, None
    d = k.shape[-1]
    return (TensorDescriptor.from_tensor(k, block_shape=[1, block_n, 1, d]),
            TensorDescriptor.from_tensor(v, block_shape=[1, block_n, 1, d]))


_COUNTERS: dict = {}  # (device, stream id or "graph", n) -> int32 counters of the fused combine, 0 between calls


def _counters(device, n: int):
    """n int32 arrival counters for the fused combine (one per (sequence, KV head, row block)),
    all 0 on entry, from this module's cache (`counters.arrival_counters` says how they are kept
    per stream and for CUDA graphs). The kernel puts each counter back to 0 (its last-arriving
    program), so a buffer is reused without a memset."""
    return arrival_counters(_COUNTERS, device, n)


def _launch(q, k, v, kd, vd, seqlens, block_table, out, scale, shape: DecodeShape, cfg: DecodeConfig, S: int):
    B, Tq, Hq, d = q.shape
    Hk, G, L = shape.Hk, shape.G, shape.L
    R = Tq * G
    rows = max(16, next_pow2(min(R, cfg.max_rows)))
    n_rb = cdiv(R, rows)
    block_l = max(16, min(cfg.block_l, next_pow2(Tq * max(L, 1))))
    direct = S == 1
    if L == 0:
        kd = vd = q  # never read
        dstr = (0, 0, 0, 0)
    else:
        if kd.stride() != vd.stride():
            kd, vd = kd.contiguous(), vd.contiguous()
        dstr = (kd.stride(0), kd.stride(1), kd.stride(2), kd.stride(3))
    if direct:
        dst, lse = out, out
    else:
        dst = torch.empty((B * Hk, S, R, d), device=q.device, dtype=torch.float32)
        lse = torch.empty((B * Hk, S, R), device=q.device, dtype=torch.float32)
    sl = seqlens if seqlens is not None else q
    bt = block_table if block_table is not None else q
    sbt = block_table.stride(0) if block_table is not None else 0
    prec = dot_precision(q.dtype)
    kdesc, vdesc = _descriptors(k, v, cfg.block_n) if cfg.tma and not shape.paged else (None, None)
    fused = cfg.fused_combine and not direct
    block_s = cfg.combine_block_s or max(1, min(next_pow2(S), 4096 // d))
    cnt = _counters(q.device, B * Hk * n_rb) if fused else lse
    pdl = cfg.pdl and not (direct or fused) and _pdl_active(q.device)  # False: both kernels as without the knob
    strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
               v.stride(0), v.stride(1), v.stride(2), *dstr, sbt, out.stride(0), out.stride(1), out.stride(2))
    # the launches' specialisation, for `CachedLaunch`: shapes, strides, dtypes, tiles and modes,
    # with every pointer the caller gave 16-byte aligned (else Triton's own path); the buffers
    # made here are
    key = None
    if aligned16(q, k, v, kd, vd, sl, bt, out):
        key = (q.dtype, k.dtype, kd.dtype, sl.dtype, bt.dtype, B, Tq, Hq, Hk, d, L, shape.Tk, S, n_rb, shape.num_blocks,
               shape.page_size, shape.paged, seqlens is not None, rows, block_l, block_s, cfg.block_n, prec,
               kdesc is not None, fused, direct, pdl, cfg.num_warps, cfg.num_stages, cfg.combine_warps, strides)
    _SPLIT_LAUNCH(key, (B * Hk, n_rb * S),
                  (q, k, v, kd, vd, sl, bt, dst, lse, kdesc if kdesc is not None else k,
                   vdesc if vdesc is not None else v, out, cnt, scale * LOG2E, Tq, shape.Tk, L, G, Hk, R, S, n_rb,
                   shape.num_blocks, *strides),
                  lambda: dict(ROWS=rows, BLOCK_N=cfg.block_n, BLOCK_L=block_l, HEAD_DIM=d,
                               PAGE_SIZE=max(shape.page_size, 1), PAGED=shape.paged, HAS_SEQLENS=seqlens is not None,
                               HAS_DEPTH=L > 0, DIRECT=direct, PREC=prec, TMA=kdesc is not None, FUSED_COMBINE=fused,
                               COMBINE_BLOCK_S=block_s if fused else 1, PDL=pdl, num_warps=cfg.num_warps,
                               num_stages=cfg.num_stages))
    if direct or fused:
        return
    _COMBINE_LAUNCH(key, (B * Hk * R,),
                    (dst, lse, out, sl, Tq, shape.Tk, G, Hk, R, S, out.stride(0), out.stride(1), out.stride(2)),
                    lambda: dict(BLOCK_N=cfg.block_n, BLOCK_S=block_s, HEAD_DIM=d, HAS_SEQLENS=seqlens is not None,
                                 HAS_DEPTH=L > 0, PDL=pdl, num_warps=cfg.combine_warps,
                                 **({"launch_pdl": True} if pdl else {})))


_SPLIT_LAUNCH, _COMBINE_LAUNCH = CachedLaunch(decode_split_kernel), CachedLaunch(decode_combine_kernel)


def moda_decode(q, k_cache, v_cache, k_depth=None, v_depth=None, *, cache_seqlens=None, scale=None,
                block_table=None, num_splits=None, config: DecodeConfig | None = None,
                check_values: bool | None = None):
    """One MoDA decode step (forward only, no autograd): each of the Tq new tokens attends to
    its sequence's cache up to its own position and to its own L depth entries, under one
    softmax.

    q (B, Tq, Hq, d): the Tq newest tokens of each sequence (their K/V already in the cache).
    k_cache, v_cache (B, Tk, Hk, d), or with block_table (B, max_blocks) int32 the pages
    (num_blocks, page_size, Hk, d). k_depth, v_depth (B, Tq, L, Hk, d) or None (L = 0).
    cache_seqlens (B,) int32: tokens n_b of sequence b (default Tk; required when paged); new
    token i sits at position n_b - Tq + i and sees positions 0 .. n_b - Tq + i of KV head h // G.
    scale: default 1/sqrt(d). num_splits: the split-KV factor S (None: `choose_num_splits`; 1:
    no split, one launch). config: tile settings (`DecodeConfig`; None: `default_config` of q's
    device and B*Hk). check_values: read cache_seqlens / block_table to check their values:
    None (default) only when they are CPU tensors (no device sync); on the GPU unchecked bad
    values give NaN rows, never a stray read. Returns (B, Tq, Hq, d) in q's dtype. bf16, fp16, fp32;
    d in {16, 32, 64, 128}.

    Under torch.compile it is the torch custom op `torch.ops.moda_bench.moda_decode` (fake
    implementation: q's shape and dtype), one graph node; the config travels as its JSON key. The depth
    entries may be strided views (e.g. one slice of a depth-KV cache): read in place.
    """
    if not all(t is None or isinstance(t, torch.Tensor) for t in (q, k_cache, v_cache, k_depth, v_depth,
                                                                    cache_seqlens, block_table)):
        # the check's TypeError names the argument (the dispatcher's would not); the op checks the rest
        check_decode_inputs(q, k_cache, v_cache, k_depth, v_depth, cache_seqlens, block_table, need_cuda=True,
                            check_values=check_values)
    if not through_ops():  # eager: the implementation itself (`oplib.through_ops`)
        return _decode(q, k_cache, v_cache, k_depth, v_depth, cache_seqlens, scale, block_table, num_splits, config,
                       check_values)
    return moda_decode_op(q, k_cache, v_cache, k_depth, v_depth, cache_seqlens, block_table,
                          None if scale is None else float(scale), num_splits, config_key(config), check_values)


@torch.library.custom_op("moda_bench::moda_decode", mutates_args=())
def moda_decode_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k_depth: Optional[torch.Tensor],
                   v_depth: Optional[torch.Tensor], cache_seqlens: Optional[torch.Tensor],
                   block_table: Optional[torch.Tensor], scale: Optional[float], num_splits: Optional[int],
                   config: str, check_values: Optional[bool]) -> torch.Tensor:
    """`moda_decode` as a custom op: the same arguments, config as `oplib.config_key`'s string."""
    return _decode(q, k_cache, v_cache, k_depth, v_depth, cache_seqlens, scale, block_table, num_splits,
                   config_of(config, DecodeConfig), check_values)


@moda_decode_op.register_fake
def _(q, k_cache, v_cache, k_depth, v_depth, cache_seqlens, block_table, scale, num_splits, config, check_values):
    return torch.empty(q.shape, device=q.device, dtype=q.dtype)


def _decode(q, k_cache, v_cache, k_depth, v_depth, cache_seqlens, scale, block_table, num_splits, config,
            check_values):
    """The decode step's checks and launches (`moda_decode_op`'s implementation)."""
    shape = check_decode_inputs(q, k_cache, v_cache, k_depth, v_depth, cache_seqlens, block_table, need_cuda=True,
                                check_values=check_values)
    cfg = _resolved(config or default_config(q.device, shape.B * shape.Hk), shape.d)
    S = resolve_num_splits(num_splits, shape, cfg, q.device)
    scale = 1.0 / math.sqrt(shape.d) if scale is None else float(scale)
    q, k_cache, v_cache = (_last_dim_contiguous(t) for t in (q, k_cache, v_cache))
    if shape.L:
        k_depth, v_depth = _last_dim_contiguous(k_depth), _last_dim_contiguous(v_depth)
    if block_table is not None and block_table.stride(-1) != 1:
        block_table = block_table.contiguous()
    if cache_seqlens is not None:
        cache_seqlens = cache_seqlens.contiguous()  # the kernels index it with stride 1
    out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    if q.device.type == "cuda" and q.device.index not in (None, torch.cuda.current_device()):
        with torch.cuda.device(q.device):
            _launch(q, k_cache, v_cache, k_depth, v_depth, cache_seqlens, block_table, out, scale, shape, cfg, S)
    else:
        _launch(q, k_cache, v_cache, k_depth, v_depth, cache_seqlens, block_table, out, scale, shape, cfg, S)
    return out
