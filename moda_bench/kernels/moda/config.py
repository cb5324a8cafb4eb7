"""Launch configuration of the fused MoDA kernel: `MoDAConfig`, its validity rules, how one is chosen for a call.

A `MoDAConfig` fixes the tile shapes of the three Triton kernels (forward, backward dq/depth pass,
backward dk/dv pass) and where the depth part runs. `resolve_config` picks one for a call, in this order:
  1. an explicit `config=`;
  2. the installed config source (a function (shape, dtype) -> MoDAConfig | None;
     `moda_bench.tuning.use()` installs the user's tuning cache as one);
  3. the configs shipped for this GPU (`tuned/<gpu-slug>.json`, written by `moda-bench tune
     --export-shipped`; keyed by triton major.minor, dtype, d, G, L and the power-of-two bucket
     of T, read lazily once per GPU);
  4. `default_config`, a heuristic.
Nothing installs a source at import. `set_shipped(False)` (what `tuning.using(False)`, `sweep
--no-tuned` and $MODA_BENCH_NO_TUNING=1 do) skips step 3: heuristic defaults only.

The answer for a (shape, dtype, device) is memoised, dropped when the source is replaced, when
its `stamp()` (the tuning cache has one) changes, or on `reset_shipped()` (a source without
`stamp` is asked every call). `check_config`: the kernel's rule for a valid config (memoised; the
same config object again by its identity).
"""
from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Callable, Optional

import torch
import triton

from moda_bench.kernels.launch import cdiv, cuda_calls, next_pow2
from moda_bench.kernels.moda.validate import MoDAShape

# Where the depth part of a pass can run (MoDAConfig.fwd_depth / bwd_depth), in the tuner's order; plus "tma"
# (descriptor kernels: `kernel_fwd_tma`, the folded-row `kernel_bwd_tma`) and "persist" (`kernel_depth`).
DEPTH_MODES = ("split", "stream", "fused", "overlap")
FWD_DEPTH_MODES = BWD_DEPTH_MODES = DEPTH_MODES + ("tma", "persist")
BWD_DEPTH_KERNELS = ("triton", "cute")  # the "persist" backward's depth kernel (MoDAConfig.bwd_depth_kernel)


@dataclass(frozen=True)
class MoDAConfig:
    """Tile shapes. Rows are (position, query-head-in-group) pairs folded as r = t*GP + g.

    block_m   C: query rows per forward program (a multiple of GP = next_pow2(G)).
    block_n   sequence keys per inner step of the forward.
    depth_sub positions per depth sub-tile; 0 = auto (fewest positions whose rows fill a
              16-row tensor-core tile, utilisation -> min(1, G/16)); block_m // GP = one
              dense masked tile over the whole chunk (the paper's group-aware kernel, G/C).
    block_l   depth columns per depth step.
    depth_stages software-pipelining depth of the (short) depth loop; 1 keeps its tiles out of
              the pipeline's shared memory, so occupancy stays that of the sequence loop.
    bwd_*     the same for the backward's dq/dkd/dvd pass (q-major) and dk/dv pass (kv-major).
    fwd_depth where the forward's depth phase runs: "fused" (after the sequence loop, same program),
              "split" (a depth-only launch first; the sequence kernel starts its online softmax
              from that partial), "overlap" (depth-only programs in the sequence kernel's grid,
              partials merged), "stream" (the depth-only kernel on a second CUDA stream, beside
              the L=0 sequence kernel, then the merge).
    bwd_depth where the backward's depth part (its dq share, dk_depth, dv_depth) runs:
              "fused" (in the q-major pass), "split" (a depth-only launch), "overlap"
              (depth-only programs in the kv-major pass's grid, so the depth bytes stream
              while dk/dv compute), "stream" (a depth-only launch on a second CUDA stream,
              concurrent with the dk/dv pass), "tma" (`kernel_bwd_tma`, the default on Hopper:
              the query-major pass first, which also stores each row's lse and delta in flat
              buffers, the depth part fused in it; then the key-major pass, heaviest key tiles
              first; descriptor loads where usable, else pointers; at L = 0 too), reading bwd_q_*,
              bwd_kv_*, bwd_block_l (depth columns a sub-tile's step, 0 = auto), bwd_depth_stages.
    fwd_maxnreg, bwd_q_maxnreg, bwd_kv_maxnreg  "tma" forward / backward passes: registers per
              thread (0 = the compiler's choice); 168 at 4 warps fits three programs an SM.
    depth_ctas, bwd_depth_ctas  programs of the forward's / backward's depth-only launch (0 = one
              per row block; n > 0: at most n persistent programs, so beside a sequence kernel
              the depth part holds a fixed share of the GPU's slots for the whole pass).
    side_priority  the side stream of "stream" (and moda-fa4's depth launches) at the device's
              highest priority, so its programs are placed before the sequence kernel's.
    depth_after, bwd_depth_after  "stream" only: the depth-only kernel launched after the
              sequence kernel, whose programs then take their slots first (the small depth
              programs fill the rest, so their bytes stream while the sequence part computes).
    depth_block_m, depth_warps  rows and warps of the forward's depth-only program ("split", "stream").
    bwd_depth_block_m, bwd_depth_warps, bwd_block_l, bwd_depth_stages  the same for the backward's
              depth part (its own launch, "overlap" programs, or, for block_l and stages, the q-major pass).
    reverse   visit query blocks heaviest-first (last causal block first) in the forward and q-major pass.
    bwd_tma   the backward's sequence tiles through descriptors: the q-major pass's K/V tiles, the key-major
              pass's q/do tiles (bwd_kv_block_m a multiple of GP there, else that pass keeps pointer loads).
    fa4_fused_fwd  moda-fa4 only: the forward is FA4's sm90 kernel with the depth tiles inside (`fused_sm90`).
    bwd_depth_kernel  "persist" backward's depth kernel: "triton" (kernel_depth) or "cute" (depth_bwd_sm90).
    bwd_kv_beside  "tma" backward: the key-major pass on a second stream beside the dq pass (1), after it (0), or
              both in one launch (2, `_one_kernel`); -1 by the rules (`kernel_bwd_rules.kv_beside`, `kv_one`).
    bwd_kv_chunk  "tma" backward: a key-major program takes at most n key tiles' width of rows (n > 0; a
              tile's chunks summed by the last), 0 all, -1 as the grid needs (`kernel_bwd_rules.kv_chunk`).
    bwd_depth_items  "tma" backward: the depth part as items of the key-major grid, not in the dq pass (1 on;
              0 and -1 off: measured no faster, `kernel_bwd_rules.kv_depth_items`).
    bwd_dq_heads  "tma" backward, L = 0: the dq pass a query head a program (1, 0; -1: `kernel_bwd_rules.dq_heads`).
    exp_poly  an ablation, slower on the H100 (docs/PERFORMANCE.md row 32): "tma" passes with half their probabilities
              on the FMA pipe (`triton_utils.exp2_mix`; 16-bit inputs): bits 1 forward, 2 dq pass, 4 key-major pass.
    """

    block_m: int = 64
    block_n: int = 64
    depth_sub: int = 0
    block_l: int = 64
    depth_stages: int = 2
    num_warps: int = 4
    num_stages: int = 3
    bwd_q_block_m: int = 64
    bwd_q_block_n: int = 64
    bwd_q_warps: int = 4
    bwd_q_stages: int = 3
    bwd_kv_block_m: int = 64
    bwd_kv_block_n: int = 64
    bwd_kv_warps: int = 4
    bwd_kv_stages: int = 3
    fwd_depth: str = "split"
    bwd_depth: str = "stream"
    depth_after: bool = False
    bwd_depth_after: bool = False
    depth_block_m: int = 64
    depth_warps: int = 4
    bwd_depth_block_m: int = 64
    bwd_depth_warps: int = 4
    bwd_block_l: int = 64
    bwd_depth_stages: int = 2
    reverse: bool = False
    bwd_tma: bool = False
    bwd_q_maxnreg: int = 0
    bwd_kv_maxnreg: int = 0
    fwd_maxnreg: int = 0
    depth_ctas: int = 0
    bwd_depth_ctas: int = 0
    side_priority: bool = False
    fa4_fused_fwd: bool = False
    bwd_depth_kernel: str = "triton"
    bwd_kv_beside: int = -1
    bwd_kv_chunk: int = -1
    bwd_depth_items: int = -1
    bwd_dq_heads: int = -1
    exp_poly: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "MoDAConfig":
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown MoDAConfig fields: {sorted(unknown)}")
        return cls(**d)

    def replace(self, **kw) -> "MoDAConfig":
        return replace(self, **kw)


def group_pad(G: int) -> int:
    """GP: G rounded up to a power of two (rows of one position inside a block)."""
    return next_pow2(G)


def auto_depth_sub(G: int, block_m: int) -> int:
    """Fewest positions whose GP rows make a 16-row MMA tile, capped at the chunk."""
    gp = group_pad(G)
    return max(1, min(block_m // gp, cdiv(16, gp)))


# Up to this T the pointer kernels' depth phase stays fused: short sequences cannot hide the
# depth-only launches, side-stream sync and merge (docs/PERFORMANCE.md, change 8).
FUSED_DEPTH_MAX_T = 2048


def tma_default(shape: MoDAShape, dtype=None) -> bool:
    """Whether the heuristic default runs the forward as "tma": a Hopper-or-newer GPU, a Triton with
    device-side descriptors, 16-bit inputs, d <= 64 (where it beat the pointer forward:
    docs/PERFORMANCE.md, change 9), G <= 16 or G <= 32 and T > 1024 (the capped 64-row programs of
    changes 26 and 29; at T = 1024 and G > 32 the pointer forward stays ahead); at T <=
    FUSED_DEPTH_MAX_T only with L > 0 and G >= 2 (change 28: there the depth bytes stream in the same
    program; at L = 0 or G = 1 the pointer forward is faster)."""
    big_g = shape.G > 32 or (shape.G > 16 and shape.T <= 1024)
    short = shape.T <= FUSED_DEPTH_MAX_T and (shape.L == 0 or shape.G < 2)
    if shape.d > 64 or big_g or short:
        return False
    return _descriptor_gpu(dtype)


def _descriptor_gpu(dtype=None) -> bool:
    """16-bit inputs, a Hopper-or-newer current GPU, a Triton with device-side descriptors."""
    if dtype_name(dtype or "bfloat16") not in ("bfloat16", "float16"):
        return False
    idx = current_device_index()
    if idx < 0 or not hasattr(triton.language, "make_tensor_descriptor"):
        return False
    return _capability(idx) >= 9


def pointer_bwd_depth(T: int) -> str:
    """The backward placement of the pointer kernels' default at sequence length T: "fused" up to
    FUSED_DEPTH_MAX_T, else "stream" (what a "tma" config falls back to where its kernels cannot run)."""
    return "fused" if T <= FUSED_DEPTH_MAX_T else "stream"


_capabilities: dict[int, int] = {}


def _capability(idx: int) -> int:  # major compute capability of CUDA device idx (memoised)
    if idx not in _capabilities:
        _capabilities[idx] = torch.cuda.get_device_capability(idx)[0]
    return _capabilities[idx]


# Descriptor forward tiles ("tma"; G=32: `default_config`): 64 rows, 4 warps, at least level with
# 128 rows on 8 warps at every measured point (docs/PERFORMANCE.md, change 37)
TMA_BLOCK_M, TMA_BLOCK_N, TMA_WARPS, TMA_STAGES = 64, 64, 4, 3
# The backward's sequence tiles through descriptors by default: no, slower than pointer loads with
# bit-identical gradients (docs/PERFORMANCE.md, change 10); kept as a config field.
BWD_TMA_DEFAULT = False
# Registers a thread of the "tma" backward's passes (4 warps, d <= 64), only above T = 4096: there
# three programs share an SM and the passes gain; at 4096 and below the cap costs more than it
# gives (docs/DESIGN.md, "The Triton kernel"; docs/PERFORMANCE.md, changes 11 and 16).
# Uncapped (T <= 4096) the depth loop of the dq pass keeps 3 stages in flight, else 2: capped, the
# third stage's shared memory costs a program an SM (docs/PERFORMANCE.md, change 19).
BWD_TMA_MAXNREG, BWD_TMA_MAXNREG_MIN_T = 168, 4096


def tma_block_l(G: int, block_m: int, rows: int = 256, max_cols: int = 64) -> int:
    """Depth columns per step of the descriptor kernels: S positions x BL entries each, with
    P*BL about `rows` depth rows (P = block_m // GP positions; BL at most 64; S*BL >= 16) and
    S*BL <= max_cols. Forward: 256 rows; the backward's dq pass: 128 rows (the fastest of 64, 128
    and 256: docs/DESIGN.md, "The Triton kernel"), 32 columns (at G=32, 64 columns spilled:
    docs/PERFORMANCE.md, change 24)."""
    gp = group_pad(G)
    P = max(1, block_m // gp)
    S = max(1, min(P, 16 // gp))
    return S * max(cdiv(16, S), min(64, max(1, rows // P), max(1, max_cols // S)))


def bwd_tma_default(shape: MoDAShape, dtype=None) -> bool:
    """Whether the heuristic default runs the backward as "tma" (`kernel_bwd_tma`): a Hopper-or-
    newer current GPU with device-side tensor descriptors, 16-bit inputs, d <= 64 (what was
    measured: faster than the pointer passes at every measured shape, docs/PERFORMANCE.md, change 11)."""
    return shape.d <= 64 and _descriptor_gpu(dtype)


def pointer_block_l(L: int) -> int:
    """The default depth columns per step of the pointer kernels (fused, split, stream, overlap)."""
    return min(64, max(16, next_pow2(max(L, 1))))


def default_config(shape: MoDAShape, dtype=None) -> MoDAConfig:
    """Heuristic used when no tuned entry exists."""
    gp = group_pad(shape.G)
    bm = max(64, gp)
    bl = pointer_block_l(shape.L)
    cfg = MoDAConfig(block_m=bm, bwd_q_block_m=max(64, gp), block_l=bl, bwd_block_l=bl)
    if shape.T <= FUSED_DEPTH_MAX_T:
        cfg = cfg.replace(fwd_depth="fused", bwd_depth="fused")
    if shape.d > 64:
        cfg = cfg.replace(num_stages=2, bwd_q_stages=2, bwd_kv_stages=2, bwd_q_block_n=32, bwd_kv_block_m=32)
    if tma_default(shape, dtype):
        tbm, w, freg = (TMA_BLOCK_M, TMA_WARPS, 0) if gp <= 16 else (max(64, gp), 4, BWD_TMA_MAXNREG)  # tma_default
        cfg = cfg.replace(fwd_depth="tma", block_m=tbm, block_n=TMA_BLOCK_N, num_warps=w, fwd_maxnreg=freg,
                          num_stages=TMA_STAGES, block_l=tma_block_l(shape.G, tbm, 256, 32), bwd_tma=BWD_TMA_DEFAULT)
    if bwd_tma_default(shape, dtype):
        reg = BWD_TMA_MAXNREG if shape.T > BWD_TMA_MAXNREG_MIN_T else 0
        cfg = cfg.replace(bwd_depth="tma", bwd_q_block_m=max(64, gp), bwd_q_block_n=64, bwd_q_warps=4, bwd_q_stages=3,
                          bwd_kv_block_m=max(64, gp), bwd_kv_block_n=64, bwd_kv_warps=4, bwd_kv_stages=3,
                          bwd_block_l=tma_block_l(shape.G, max(64, gp), 128, 32), bwd_depth_stages=3 - bool(reg),
                          bwd_kv_maxnreg=reg, bwd_q_maxnreg=reg)
    return cfg


def fused_depth_sub(cfg: MoDAConfig, G: int, block_m: int) -> int:
    """Depth sub-tile positions of a sequence-kernel program of block_m rows (block_m or
    bwd_q_block_m) running the depth phase fused: cfg.depth_sub (0 = auto); ValueError unless it
    divides the block's positions and its rows fill a 16-row tile."""
    s = cfg.depth_sub or auto_depth_sub(G, block_m)
    P = block_m // group_pad(G)
    if P % s != 0 or s * group_pad(G) < 16:
        raise ValueError(f"config depth_sub={cfg.depth_sub} invalid for G={G}, block_m={block_m}: need a divisor "
                         f"of {P} positions with depth_sub*{group_pad(G)} >= 16")
    return s


def depth_only_sub(cfg: MoDAConfig, G: int, block_m: int) -> int:
    """Depth sub-tile positions of a depth-only program of block_m rows: cfg.depth_sub where it fits, else auto."""
    P = block_m // group_pad(G)
    s = cfg.depth_sub
    if s and P % s == 0 and s * group_pad(G) >= 16:
        return s
    return auto_depth_sub(G, block_m)


_VALID: dict = {}  # (cfg, G) and (id(cfg), G) of pairs check_config accepted -> cfg


def check_config(cfg: MoDAConfig, G: int) -> None:
    """Raise ValueError if cfg cannot run for group size G (memoised; the same object again by its id, no hash)."""
    if _VALID.get((id(cfg), G)) is cfg:
        return
    try:
        known = (cfg, G) in _VALID
    except TypeError:  # an unhashable field value: not a config the kernel can take
        _check(cfg, G)
        raise ValueError(f"config has an unhashable field value: {cfg!r}") from None
    if not known:
        _check(cfg, G)
    if len(_VALID) >= _MEMO_MAX:
        _VALID.clear()
    _VALID[(cfg, G)] = _VALID[(id(cfg), G)] = cfg  # the entry keeps cfg, so its id is not reused meanwhile


def _check(cfg: MoDAConfig, G: int) -> None:
    gp = group_pad(G)
    for name in ("block_m", "bwd_q_block_m", "depth_block_m", "bwd_depth_block_m"):
        bm = getattr(cfg, name)
        if bm < 16 or bm & (bm - 1) or bm % gp:
            raise ValueError(f"config {name}={bm} must be a power of two >= 16 and a multiple of GP={gp} (G={G})")
    for name in ("block_m", "bwd_q_block_m"):
        fused_depth_sub(cfg, G, getattr(cfg, name))
    for name in ("block_n", "bwd_q_block_n", "bwd_kv_block_m", "bwd_kv_block_n", "block_l", "bwd_block_l"):
        v = getattr(cfg, name)
        if v < 16 or v & (v - 1):
            raise ValueError(f"config {name}={v} must be a power of two >= 16")
    for name, modes in (("fwd_depth", FWD_DEPTH_MODES), ("bwd_depth", BWD_DEPTH_MODES),
                        ("bwd_depth_kernel", BWD_DEPTH_KERNELS)):
        if getattr(cfg, name) not in modes:
            raise ValueError(f"config {name}={getattr(cfg, name)!r} must be one of {modes}")
    for name in ("depth_ctas", "bwd_depth_ctas"):
        if not isinstance(getattr(cfg, name), int) or getattr(cfg, name) < 0:
            raise ValueError(f"config {name}={getattr(cfg, name)!r} must be 0 (no cap) or a number of programs")
    for name, ok in (("bwd_kv_beside", (-1, 0, 1, 2)), ("bwd_depth_items", (-1, 0, 1)), ("bwd_dq_heads", (-1, 0, 1))):
        if getattr(cfg, name) not in ok:  # bwd_kv_beside 2: both backward passes in one launch
            raise ValueError(f"config {name}={getattr(cfg, name)!r} must be -1 (by shape) or in {ok[1:]}")
    if cfg.exp_poly not in range(8):
        raise ValueError(f"config exp_poly={cfg.exp_poly!r} must be 0..7 (bits: 1 forward, 2 dq pass, 4 key-major)")
    if not isinstance(cfg.bwd_kv_chunk, int) or cfg.bwd_kv_chunk < -1:
        raise ValueError(f"config bwd_kv_chunk={cfg.bwd_kv_chunk!r} must be -1 (by the grid), 0 or key tiles")
    for name in ("fwd_maxnreg", "bwd_q_maxnreg", "bwd_kv_maxnreg"):
        v = getattr(cfg, name)
        if not isinstance(v, int) or v < 0 or (v and not 24 <= v <= 255):
            raise ValueError(f"config {name}={v} must be 0 (the compiler's choice) or 24..255 registers")
    if cfg.bwd_depth == "tma":
        s = auto_depth_sub(G, cfg.bwd_q_block_m)
        bl = cfg.bwd_block_l // s
        if cfg.bwd_block_l % s or bl & (bl - 1) or cfg.bwd_kv_block_m % gp:
            raise ValueError(f"config bwd_block_l={cfg.bwd_block_l} must be a power-of-two multiple of the depth "
                             f"sub-tile's {s} positions and bwd_kv_block_m={cfg.bwd_kv_block_m} a multiple of "
                             f"GP={gp} for bwd_depth='tma' (G={G}, bwd_q_block_m={cfg.bwd_q_block_m})")
    if cfg.fwd_depth == "tma":
        s = fused_depth_sub(cfg, G, cfg.block_m)
        bl = cfg.block_l // s
        if cfg.block_l % s or bl & (bl - 1):
            raise ValueError(f"config block_l={cfg.block_l} must be a power-of-two multiple of the depth sub-tile's "
                             f"{s} positions for fwd_depth='tma' (G={G}, block_m={cfg.block_m})")


# ----------------------------------------------------------------------------- device, names, buckets

ENV_NO_TUNING = "MODA_BENCH_NO_TUNING"
_MEMO_MAX = 4096  # memo entries before a memo is dropped (variable-length callers)
_cuda_ok: Optional[bool] = None
_gpu_names: dict[int, str] = {}


def current_device_index() -> int:
    """Current CUDA device index, -1 without CUDA (availability checked once)."""
    global _cuda_ok
    try:
        if _cuda_ok is None:
            _cuda_ok = bool(torch.cuda.is_available())
        return cuda_calls()[0]() if _cuda_ok else -1
    except Exception:  # pragma: no cover - a broken driver means no GPU to key on
        return -1


def current_gpu_name() -> str:
    """Name of the current CUDA device (memoised per index), 'cpu' without CUDA."""
    idx = current_device_index()
    if idx < 0:
        return "cpu"
    name = _gpu_names.get(idx)
    if name is None:
        name = _gpu_names[idx] = torch.cuda.get_device_name(idx)
    return name


def dtype_name(dtype) -> str:
    """'bfloat16' for torch.bfloat16 or 'bfloat16'; the caches and CSVs use this spelling."""
    return str(dtype).removeprefix("torch.")


def t_bucket(T: int) -> int:
    """Power-of-two bucket of a sequence length: the smallest 2^k >= T."""
    return 1 << (max(int(T), 1) - 1).bit_length()


def triton_minor(version: Optional[str] = None) -> str:
    """'3.6' for triton 3.6.x (the shipped configs' key; the user cache keys the full version)."""
    return ".".join((triton.__version__ if version is None else str(version)).split(".")[:2])


def gpu_slug(gpu: str) -> str:
    """File-name form of a GPU name: 'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-") or "unknown"


# ----------------------------------------------------------------------------- shipped configs

SHIPPED_SCHEMA_VERSION = 1
SHIPPED_DIR = Path(__file__).with_name("tuned")  # package data; tests point it elsewhere
_shipped_tables: dict[str, dict] = {}  # GPU name -> {shipped key: entry}
_shipped_on = True


# Operators with tuned configs of their own: `moda_attention` ("moda", keys as they always were), `moda_fa4`
# ("moda-fa4|..." keys, read by its depth launches; without an entry of its own it takes what "moda" would).
OPS = ("moda", "moda-fa4", "moda-overlap")


def op_prefix(op: str) -> str:
    """The key prefix of an operator's tuned configs: '' for moda, '<op>|' for the others."""
    if op not in OPS:
        raise ValueError(f"unknown operator {op!r} for tuned configs; choose from {', '.join(OPS)}")
    return "" if op == "moda" else f"{op}|"


def shipped_key(shape: MoDAShape, dtype, triton_version: Optional[str] = None, op: str = "moda") -> str:
    """'[<op>|]triton <major.minor>|<dtype>|d<d>|G<G>|L<L>|T<=<2^k>': the key inside a GPU's
    shipped file."""
    return (f"{op_prefix(op)}triton {triton_minor(triton_version)}|{dtype_name(dtype)}|d{shape.d}|G{shape.G}"
            f"|L{shape.L}|T<={t_bucket(shape.T)}")


def shipped_path(gpu: str, directory=None) -> Path:
    """The shipped-config file of a GPU: <directory or SHIPPED_DIR>/<gpu_slug(gpu)>.json."""
    return Path(SHIPPED_DIR if directory is None else directory) / f"{gpu_slug(gpu)}.json"


def read_shipped(path, gpu: Optional[str] = None) -> dict:
    """{key: entry} of a shipped-config file; {} if it is absent, and (with a warning) if it is
    corrupt, of another schema version or, when `gpu` is given, made for another GPU."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        warnings.warn(f"moda-bench shipped configs {path} unreadable ({exc}); ignoring them", stacklevel=2)
        return {}
    problem = None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
        problem = "no 'entries' table"
    elif data.get("schema_version") != SHIPPED_SCHEMA_VERSION:
        problem = f"schema version {data.get('schema_version')!r}, expected {SHIPPED_SCHEMA_VERSION}"
    elif gpu is not None and data.get("gpu") != gpu:
        problem = f"made for GPU {data.get('gpu')!r}, not {gpu!r}"
    if problem:
        warnings.warn(f"moda-bench shipped configs {path}: {problem}; ignoring them", stacklevel=2)
        return {}
    return data["entries"]


def shipped_config(shape: MoDAShape, dtype, gpu: Optional[str] = None, op: str = "moda") -> Optional[MoDAConfig]:
    """The shipped config of (shape, dtype) for operator `op` on `gpu` (default: the current GPU),
    or None. The GPU's file is read once; an entry that no longer validates is ignored with a warning."""
    gpu = current_gpu_name() if gpu is None else gpu
    table = _shipped_tables.get(gpu)
    if table is None:
        table = _shipped_tables[gpu] = read_shipped(shipped_path(gpu), gpu)
    key = shipped_key(shape, dtype, op=op)
    entry = table.get(key)
    if not isinstance(entry, dict):
        return None
    try:
        cfg = MoDAConfig.from_dict(entry["config"])
        check_config(cfg, shape.G)
    except Exception as exc:  # noqa: BLE001 - a bad entry costs only its shape's tuning
        warnings.warn(f"moda-bench shipped config {gpu!r} {key!r} is invalid ({type(exc).__name__}: {exc}); "
                      "ignoring it", stacklevel=2)
        table.pop(key, None)
        return None
    return cfg


def set_shipped(enabled: bool) -> bool:
    """Consult the shipped configs (step 3 of `resolve_config`) or not; returns the previous setting."""
    global _shipped_on
    previous, _shipped_on = _shipped_on, bool(enabled)
    if previous != _shipped_on:
        _clear_memos()
    return previous


def shipped_enabled() -> bool:  # whether `resolve_config` consults the shipped configs (`set_shipped`)
    return _shipped_on


def reset_shipped() -> None:
    """Forget the shipped files read so far and every memoised answer (after SHIPPED_DIR or a
    shipped file changed)."""
    _shipped_tables.clear()
    _clear_memos()


# ----------------------------------------------------------------------------- resolution

ConfigSource = Callable[[MoDAShape, object], Optional[MoDAConfig]]
_source: Optional[ConfigSource] = None
_source_stamp: Optional[Callable[[], object]] = None  # the source's stamp(), if it has one
_memo: dict = {}       # (shape, dtype, device) -> answer of source > shipped > default
_memo_stamp: object = None
_base_memo: dict = {}  # (shape, dtype, device) -> answer of shipped > default


def _clear_memos() -> None:
    global _memo_stamp
    _memo.clear()
    _base_memo.clear()
    _memo_stamp = None


def set_config_source(fn: Optional[ConfigSource]) -> Optional[ConfigSource]:
    """Install fn(shape, dtype) -> MoDAConfig | None as the config source of `resolve_config`
    (None: none); returns the source it replaces, for restoring it. A source whose answers can
    change has a `stamp()` method returning a token that changes with them (its answers are then
    memoised until it does); a source without one is asked at every call."""
    global _source, _source_stamp
    previous, _source = _source, fn
    _source_stamp = getattr(fn, "stamp", None) if fn is not None else None
    _clear_memos()
    return previous


def config_source() -> Optional[ConfigSource]:
    """The installed config source, or None."""
    return _source


def _shipped_wanted() -> bool:
    """Whether resolution consults the shipped configs: `set_shipped` on and MODA_BENCH_NO_TUNING unset."""
    return _shipped_on and os.environ.get(ENV_NO_TUNING, "0") in ("", "0")


def _base_config(shape: MoDAShape, dtype, key) -> MoDAConfig:
    """Steps 3 and 4 of `resolve_config`, memoised."""
    cfg = _base_memo.get(key)
    if cfg is None:
        if _shipped_wanted():
            cfg = shipped_config(shape, dtype)
        cfg = cfg or default_config(shape, dtype)
        if len(_base_memo) >= _MEMO_MAX:
            _base_memo.clear()
        _base_memo[key] = cfg
    return cfg


def op_config(shape: MoDAShape, dtype, op: str) -> Optional[MoDAConfig]:
    """An operator's own tuned config (op other than "moda"): the installed source's entry for
    it (a source with an op-aware `config(shape, dtype, op=)`, as the tuning cache has), else
    this GPU's shipped one; None where neither has one. The shipped answer is memoised."""
    src = _source
    if src is not None and callable(getattr(src, "config", None)):   # plain-function sources know only moda
        cfg = src.config(shape, dtype, op=op)
        if cfg is not None:
            return cfg
    key = (shape, dtype, current_device_index(), op)
    if key not in _base_memo:
        if len(_base_memo) >= _MEMO_MAX:
            _base_memo.clear()
        _base_memo[key] = shipped_config(shape, dtype, op=op) if _shipped_wanted() else None
    return _base_memo[key]


def resolve_config(shape: MoDAShape, dtype, config: Optional[MoDAConfig] = None, op: str = "moda") -> MoDAConfig:
    """Explicit config, else the installed source's answer, else this GPU's shipped config, else
    the heuristic default (memoised per shape, dtype and device; see the module docstring). An
    operator other than "moda" (`OPS`) first looks for its own entries (`op_config`), then
    answers as for "moda"."""
    if config is not None:
        return config
    if op != "moda":
        return op_config(shape, dtype, op) or resolve_config(shape, dtype)
    global _memo_stamp
    key = (shape, dtype, current_device_index())
    src = _source
    if src is None:
        return _base_memo.get(key) or _base_config(shape, dtype, key)
    if _source_stamp is None:  # a plain function: its answers may change at any call
        return src(shape, dtype) or _base_config(shape, dtype, key)
    stamp = _source_stamp()
    if stamp != _memo_stamp:
        _memo.clear()
        _memo_stamp = stamp
    cfg = _memo.get(key)
    if cfg is None:
        cfg = src(shape, dtype) or _base_config(shape, dtype, key)
        if len(_memo) >= _MEMO_MAX:
            _memo.clear()
        _memo[key] = cfg
    return cfg
