"""What the MoDA tuner may try: the five groups of MoDAConfig fields, their search spaces,
and the pruning that drops configs before anything compiles.

Search spaces (one group of MoDAConfig fields each, tuned one after another in this order):
  fwd_depth where the forward's depth phase runs (fwd_depth: split / stream / fused / overlap /
          tma, the descriptor-load kernel)
          and, for the depth-only launch of split/stream, depth_block_m x depth_warps (x
          depth_after, the launch order of "stream"); timed on the forward pass. Skipped
          when L = 0;
  bwd_depth the same for the backward's depth part (bwd_depth: the four, and tma, the folded-row
          passes of kernel_bwd_tma): bwd_depth x bwd_depth_block_m x
          bwd_depth_warps x bwd_block_l x bwd_depth_stages x bwd_depth_after (fields a
          placement does not use stay at the base's values); timed on the backward pass.
          Skipped when L = 0;
  fwd     block_m (chunk C, rows) x block_n x num_warps x num_stages x depth_sub x block_l
          (x fwd_maxnreg 0 / 168 when the base's forward is "tma"), timed on the forward pass
          (no grad), backward fields at their defaults;
  bwd_q   dq / depth-grad pass: bwd_q_block_m x bwd_q_block_n x bwd_q_warps x bwd_q_stages
          (x bwd_q_maxnreg 0 / 168 when the base's backward is "tma", x bwd_dq_heads where a dq pass
          a head a program can run: the base's and the other pass), timed on the backward pass
          with the forward winner fixed;
  bwd_kv  dk/dv pass: bwd_kv_block_m x bwd_kv_block_n x bwd_kv_warps x bwd_kv_stages (x
          bwd_kv_maxnreg likewise, x bwd_kv_beside: the base's, never, always, one launch, x bwd_kv_chunk:
          the base's, none, x bwd_depth_items at L > 0: the base's, on), timed on the
          backward pass with the fwd and bwd_q winners fixed.
  fwd_items, fwd_ctas, bwd_kernel, bwd_items, bwd_ctas  moda-overlap's knobs, in that order (by
          default the counts and the backward's kernel, OVERLAP_DEFAULT; the item groups when
          --kernels names them): the items of its streaming depth kernels (rows per item x depth
          steps in flight x warps: depth_block_m x depth_stages x depth_warps, and the bwd_ fields
          of Triton's backward kernel), the backward's depth kernel (bwd_depth_kernel: the base's
          and the other, "cute" or "triton", at the count that takes the same share of the SMs)
          and the programs of its forward / backward depth launch (depth_ctas, bwd_depth_ctas: the
          base's count times CTAS_FACTORS); timed on the forward / backward pass. A program's rate
          sets how many programs the depth bytes need, so each pass's kernel and items come before
          its count.
The two depth groups start with one candidate per placement (the base's other fields), since
the placement decides most of what the depth part costs; the tile groups start with a seeded
random sample (`candidate_configs`).

Pruning (`prune_reason`): row blocks must be multiples of GP = next_pow2(G) and at least GP;
an estimate of shared memory (q/k/v/depth tiles x stages x element bytes) must fit the
device's opt-in limit; fp32 tiles live per thread must fit a 255-register budget; tiles larger
than the problem (block_n > next_pow2(T), block_l > next_pow2(L), block_m > next_pow2(T*GP))
are dropped unless they are the smallest choice. The estimates are coarse: a config that
passes them and still fails to compile is skipped by the search.
"""
from __future__ import annotations

import itertools
import random
from dataclasses import fields
from typing import Iterable, Optional

from moda_bench.kernels.launch import next_pow2
from moda_bench.kernels.moda.config import (
    BWD_DEPTH_MODES,
    FWD_DEPTH_MODES,
    MoDAConfig,
    auto_depth_sub,
    check_config,
    dtype_name,
    group_pad,
)
from moda_bench.kernels.moda.triton.bwd_tma_rules import dq_heads, dq_heads_possible, kv_one_fits, pass_options
from moda_bench.kernels.moda.triton.depth_smem import HOPPER_SMEM, fit_bwd, fit_fwd, smem_limit
from moda_bench.kernels.moda.validate import MoDAShape

TILE_KERNELS = ("fwd", "bwd_q", "bwd_kv")
DEPTH_GROUPS = ("fwd_depth", "bwd_depth")
OVERLAP_GROUPS = ("fwd_items", "fwd_ctas", "bwd_kernel", "bwd_items", "bwd_ctas")  # moda-overlap's knobs, in order
# what `tune --op moda-overlap` searches unless --kernels names groups: the program counts only (with
# the item groups too the per-pass picks did not add up end to end: docs/DESIGN.md, "The overlap
# route"), and the backward's kernel (CuTe or Triton: CuTe's program streams more bytes, so it moves
# the best counts)
OVERLAP_DEFAULT = ("fwd_ctas", "bwd_kernel", "bwd_ctas")
KERNELS = DEPTH_GROUPS + TILE_KERNELS  # tuning order of moda and moda-fa4 (moda-overlap: OVERLAP_GROUPS)
DEFAULT_BUDGET = 40
DEFAULT_SMEM_BYTES = HOPPER_SMEM  # H100 / H200 opt-in shared memory per block (227 KiB)
MAX_REGS_PER_THREAD = 255

# Search values (the brief's spaces); row blocks are further filtered by GP.
ROW_BLOCKS = (32, 64, 128)
COL_BLOCKS = (32, 64, 128)
WARPS = (4, 8)
STAGES = (1, 2, 3, 4)
DEPTH_BLOCKS = (16, 32, 64)
DEPTH_WARPS = (2, 4, 8)  # the depth-only launches are memory-bound: fewer warps can pay
BWD_DEPTH_STAGES = (1, 2)
MAXNREG = (0, 168)  # registers per thread of a "tma" pass (0: the compiler's choice)
# moda-overlap: program counts tried around the base's (its heuristic's): a tail of depth work
# after FA4 costs far more than a program too many, hence more factors above 1
CTAS_FACTORS = (0.5, 0.75, 1.25, 1.5, 2.0, 3.0)
# moda-overlap's streaming items (kernel_depth): folded rows per item (multiples of GP), depth steps
# in flight, warps; the forward's items are larger (docs/DESIGN.md, "The overlap route")
ITEM_ROWS = {"fwd_items": (64, 128, 256), "bwd_items": (32, 64, 128)}
ITEM_STAGES = (2, 3, 4)
ITEM_WARPS = (4, 8)
ZERO_OK = ("depth_sub", "fwd_maxnreg", "bwd_q_maxnreg", "bwd_kv_maxnreg", "depth_ctas", "bwd_depth_ctas",
           "exp_poly")  # 0 means "auto"/"no cap"/"none"
# -1: "decided by the shape" (check_config's rule)
MINUS_OK = ("bwd_kv_beside", "bwd_kv_chunk", "bwd_depth_items", "bwd_dq_heads")

# Which MoDAConfig fields each kernel owns: (row block, column block, warps, stages).
KERNEL_FIELDS = {
    "fwd": ("block_m", "block_n", "num_warps", "num_stages", "depth_sub", "block_l", "fwd_maxnreg"),
    "bwd_q": ("bwd_q_block_m", "bwd_q_block_n", "bwd_q_warps", "bwd_q_stages", "bwd_q_maxnreg", "bwd_dq_heads"),
    "bwd_kv": ("bwd_kv_block_m", "bwd_kv_block_n", "bwd_kv_warps", "bwd_kv_stages", "bwd_kv_maxnreg",
               "bwd_kv_beside", "bwd_kv_chunk", "bwd_depth_items"),
    # depth groups: placement first, then the fields of the depth-only launch
    "fwd_depth": ("fwd_depth", "depth_block_m", "depth_warps", "depth_after"),
    "bwd_depth": ("bwd_depth", "bwd_depth_block_m", "bwd_depth_warps", "bwd_block_l", "bwd_depth_stages",
                  "bwd_depth_after"),
    "fwd_ctas": ("depth_ctas",),
    "bwd_ctas": ("bwd_depth_ctas",),
    "bwd_kernel": ("bwd_depth_kernel", "bwd_depth_ctas"),
    "fwd_items": ("depth_block_m", "depth_stages", "depth_warps"),
    "bwd_items": ("bwd_depth_block_m", "bwd_depth_stages", "bwd_depth_warps"),
}
# Fields each placement leaves unused (they stay at the base's value in the search space).
UNUSED_BY_PLACEMENT = {
    "fwd_depth": {"split": ("depth_after",), "fused": ("depth_block_m", "depth_warps", "depth_after"),
                  "overlap": ("depth_block_m", "depth_warps", "depth_after"),
                  "tma": ("depth_block_m", "depth_warps", "depth_after")},
    "bwd_depth": {"split": ("bwd_depth_after",), "fused": ("bwd_depth_block_m", "bwd_depth_warps", "bwd_depth_after"),
                  "overlap": ("bwd_depth_warps", "bwd_depth_after"),
                  "tma": ("bwd_depth_block_m", "bwd_depth_warps", "bwd_depth_after")},
}


# ----------------------------------------------------------------------------- small helpers

def element_bytes(dtype) -> int:
    return {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}.get(dtype_name(dtype), 2)


def depth_tiles(cfg: MoDAConfig, G: int, block_m: int) -> int:
    """NB: depth sub-tiles per block of `block_m` rows (P = block_m // GP positions cut into
    sub-tiles of depth_sub positions; 0 = auto). Each depth step loads NB x block_l entries."""
    P = max(1, block_m // group_pad(G))
    ds = cfg.depth_sub or auto_depth_sub(G, block_m)
    return max(1, P // max(1, min(ds, P)))


def _pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


# ----------------------------------------------------------------------------- resource estimates

def _buffers(num_stages: int) -> int:
    return max(1, num_stages - 1)


def smem_bytes(cfg: MoDAConfig, shape: MoDAShape, kernel: str, elem: int = 2) -> int:
    """Shared memory estimate of one program of `kernel` in bytes (see moda.py for the loops).

    fwd:    q tile (m, d) + stages x max(k, v tiles (n, d), depth k/v tiles (NB, block_l, d)).
    bwd_q:  q, do (m, d) + stages x max(k, v (n, d), depth k/v (NB, bwd_block_l, d)).
    bwd_kv: k, v (n, d) + stages x (q, do (m, d) + fp32 lse, delta (m,)).
    "stages" counts pipeline buffers: max(1, num_stages - 1), as Triton's NVIDIA pipeliner
    allocates for loads feeding a dot.
    """
    d = shape.d
    if kernel in ("fwd", "bwd_q"):
        if kernel == "fwd":
            m, n, S, resident, bl = cfg.block_m, cfg.block_n, _buffers(cfg.num_stages), 1, cfg.block_l
        else:
            m, n, S, resident = cfg.bwd_q_block_m, cfg.bwd_q_block_n, _buffers(cfg.bwd_q_stages), 2
            bl = cfg.bwd_block_l
        depth = 2 * depth_tiles(cfg, shape.G, m) * bl * d if shape.L > 0 else 0
        return elem * (resident * m * d + S * max(2 * n * d, depth))
    if kernel == "bwd_kv":
        m, n, S = cfg.bwd_kv_block_m, cfg.bwd_kv_block_n, _buffers(cfg.bwd_kv_stages)
        return elem * 2 * n * d + S * (elem * 2 * m * d + 4 * 2 * m)
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")


def fp32_regs_per_thread(cfg: MoDAConfig, shape: MoDAShape, kernel: str) -> float:
    """fp32 accumulator/score elements live per thread (a register-pressure estimate).

    fwd:    acc (m, d) + scores (m, max(n, block_l)).
    bwd_q:  dq (m, d) + scores and dP (m, max(n, bwd_block_l)).
    bwd_kv: dk, dv (n, d) + scores and dP (n, m).
    """
    d = shape.d
    def cols(n: int, bl: int) -> int:
        return max(n, bl) if shape.L > 0 else n
    if kernel == "fwd":
        m, n, w = cfg.block_m, cfg.block_n, cfg.num_warps
        return (m * d + m * cols(n, cfg.block_l)) / (32 * w)
    if kernel == "bwd_q":
        m, n, w = cfg.bwd_q_block_m, cfg.bwd_q_block_n, cfg.bwd_q_warps
        return (m * d + 2 * m * cols(n, cfg.bwd_block_l)) / (32 * w)
    if kernel == "bwd_kv":
        m, n, w = cfg.bwd_kv_block_m, cfg.bwd_kv_block_n, cfg.bwd_kv_warps
        return (2 * n * d + 2 * m * n) / (32 * w)
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")


def device_smem_limit(device_index: Optional[int] = None, default: int = DEFAULT_SMEM_BYTES) -> int:
    """Opt-in shared memory per block of the CUDA device, else `default` (Hopper's)."""
    try:
        import torch
        if torch.cuda.is_available():
            idx = torch.cuda.current_device() if device_index is None else device_index
            return smem_limit(torch.device("cuda", idx))
    except Exception:  # pragma: no cover - a broken driver only costs the estimate
        pass
    return default


# ----------------------------------------------------------------------------- validation / pruning

def config_problems(cfg: MoDAConfig, G: int) -> list[str]:
    """Why `cfg` cannot run for group size G (empty list = valid).

    Integer fields, then the kernel's own rule (`config.check_config`: row blocks powers of two
    >= 16 and multiples of GP, depth_sub dividing both row blocks' positions, ...). Nothing
    here depends on the GPU or on T, so it also decides whether a cached entry is stale.
    """
    bad = [f"{f.name}={getattr(cfg, f.name)!r} is not a positive integer" for f in fields(cfg)
           if f.type in (int, "int")
           and (type(getattr(cfg, f.name)) is not int
                or getattr(cfg, f.name) < (-1 if f.name in MINUS_OK else 0 if f.name in ZERO_OK else 1))]
    bad += [f"{f.name}={getattr(cfg, f.name)!r} is not a bool" for f in fields(cfg)
            if f.type in (bool, "bool") and type(getattr(cfg, f.name)) is not bool]
    bad += [f"{name}={getattr(cfg, name)} is not 1..16 warps" for name in ("num_warps", "bwd_q_warps", "bwd_kv_warps",
                                                                          "depth_warps", "bwd_depth_warps")
            if not bad and (getattr(cfg, name) > 16 or not _pow2(getattr(cfg, name)))]
    if bad:
        return bad
    try:
        check_config(cfg, G)
    except ValueError as exc:
        return [str(exc).removeprefix("config ")]
    why = one_launch_problem(cfg)
    return [f"bwd_kv_beside=2 (both backward passes in one launch) needs: {why}"] if why else []


def one_launch_problem(cfg: MoDAConfig) -> str:
    """Why cfg's bwd_kv_beside=2 cannot run its "tma" backward in one launch ('' where it can, or
    where it does not ask for one): `kernel_bwd_rules.kv_one_fits` of its passes' options."""
    if cfg.bwd_kv_beside != 2 or cfg.bwd_depth != "tma":
        return ""
    return kv_one_fits(*pass_options(cfg), cfg.bwd_dq_heads == 1, cfg.bwd_depth_items == 1)


def prune_reason(cfg: MoDAConfig, shape: MoDAShape, kernel: str, *, elem: int = 2,
                 smem_limit: int = DEFAULT_SMEM_BYTES, max_regs: float = MAX_REGS_PER_THREAD) -> Optional[str]:
    """Why `cfg` should not be compiled for `kernel` on `shape`, or None if it is worth a try.

    The reason starts with its category: 'invalid:', 'shared memory:', 'registers:' or
    'oversized:' (a tile larger than the problem, kept only when it is the smallest choice).
    """
    probs = config_problems(cfg, shape.G)
    if probs:
        return f"invalid: {probs[0]}"
    if kernel in DEPTH_GROUPS:
        return _depth_prune_reason(cfg, shape, kernel, max_regs)
    if kernel in ITEM_ROWS:
        return _item_prune_reason(cfg, shape, kernel, elem, smem_limit)
    if kernel in OVERLAP_GROUPS:  # a program count: nothing to estimate
        return None
    smem = smem_bytes(cfg, shape, kernel, elem)
    if smem > smem_limit:
        return f"shared memory: ~{smem // 1024} KiB > {smem_limit // 1024} KiB"
    regs = fp32_regs_per_thread(cfg, shape, kernel)
    if regs > max_regs:
        return f"registers: ~{regs:.0f} fp32 values/thread > {max_regs:.0f}"
    m_name, n_name = KERNEL_FIELDS[kernel][:2]
    m, n = getattr(cfg, m_name), getattr(cfg, n_name)
    why = _oversized_rows(m_name, m, shape)
    if why:
        return why
    if n > max(min(COL_BLOCKS), next_pow2(shape.T)):
        return f"oversized: {n_name}={n} > next_pow2(T={shape.T})"
    return _oversized_depth_cols("block_l", cfg.block_l, shape) if kernel == "fwd" else None


def _item_prune_reason(cfg: MoDAConfig, shape: MoDAShape, kernel: str, elem: int, limit: int) -> Optional[str]:
    """A streaming item whose shared memory `depth_smem` bounds above the limit: the kernel would
    run a smaller item (`fit_fwd` / `fit_bwd`), which another candidate already is."""
    fwd = kernel == "fwd_items"
    item = (cfg.depth_block_m, cfg.depth_stages, 0) if fwd else (cfg.bwd_depth_block_m, cfg.bwd_depth_stages, 0)
    try:
        fit = fit_fwd(shape.G, shape.d, elem, limit, *item) if fwd else \
            fit_bwd(shape.G, shape.d, shape.L, elem, limit, item[0], item[1], True)
    except ValueError as exc:  # no item fits this limit
        return f"shared memory: {exc}"
    if fit[:2] != (max(item[0], group_pad(shape.G)), item[1]) or fit[2] != 0:
        return f"shared memory: the item (rows, stages) = {item[:2]} does not fit {limit // 1024} KiB (runs as {fit})"
    return None


def _oversized_rows(name: str, m: int, shape: MoDAShape) -> Optional[str]:
    """A row block larger than the problem's folded rows (r = t*GP + g), unless it is the smallest."""
    rows = shape.T * group_pad(shape.G)
    if m > max(min(ROW_BLOCKS), next_pow2(rows)):
        return f"oversized: {name}={m} > next_pow2(T*GP={rows})"
    return None


def _oversized_depth_cols(name: str, bl: int, shape: MoDAShape) -> Optional[str]:
    """A depth column block larger than L (L > 0), unless it is the smallest."""
    if shape.L > 0 and bl > max(min(DEPTH_BLOCKS), next_pow2(shape.L)):
        return f"oversized: {name}={bl} > next_pow2(L={shape.L})"
    return None


def _depth_prune_reason(cfg: MoDAConfig, shape: MoDAShape, kernel: str, max_regs: float) -> Optional[str]:
    """prune_reason of the depth groups: registers of the depth-only program (rows x (d +
    score columns), two score tiles in the backward) and tiles larger than the problem."""
    fwd = kernel == "fwd_depth"
    mode = cfg.fwd_depth if fwd else cfg.bwd_depth
    m_name, w_name = ("depth_block_m", "depth_warps") if fwd else ("bwd_depth_block_m", "bwd_depth_warps")
    m, w = getattr(cfg, m_name), getattr(cfg, w_name)
    cols = cfg.block_l if fwd else cfg.bwd_block_l
    if mode in ("split", "stream"):
        regs = m * (shape.d + (1 if fwd else 2) * cols) / (32 * w)
        if regs > max_regs:
            return f"registers: ~{regs:.0f} fp32 values/thread > {max_regs:.0f}"
    return _oversized_rows(m_name, m, shape) or (None if fwd else _oversized_depth_cols("bwd_block_l", cols, shape))


def _depth_search_space(shape: MoDAShape, kernel: str, base: MoDAConfig) -> list[MoDAConfig]:
    """Placements x the depth-only launch's fields; unused fields keep the base's values."""
    if shape.L == 0:
        return []
    rows = _row_choices(group_pad(shape.G))
    names = KERNEL_FIELDS[kernel]
    values = {names[1]: rows, names[2]: DEPTH_WARPS, names[-1]: (False, True)}
    if kernel == "bwd_depth":
        values.update(bwd_block_l=DEPTH_BLOCKS, bwd_depth_stages=BWD_DEPTH_STAGES)
    out = []
    for mode in (FWD_DEPTH_MODES if kernel == "fwd_depth" else BWD_DEPTH_MODES):
        if mode == "persist":  # moda-overlap's placement (moda_attention refuses it): its knobs are the program counts
            continue
        unused = UNUSED_BY_PLACEMENT[kernel].get(mode, ())
        axes = [(n, (getattr(base, n),) if n in unused else values[n]) for n in names[1:]]
        for combo in itertools.product(*(v for _, v in axes)):
            out.append(base.replace(**{names[0]: mode}, **dict(zip((n for n, _ in axes), combo))))
    return out


def _bwd_kernel_space(shape: MoDAShape, base: MoDAConfig) -> list[MoDAConfig]:
    """moda-overlap's backward depth kernel: the base's, then the other at the count that takes the
    same share of the SMs (`overlap.same_share_bwd_programs`); CuTe's only where it takes the shape."""
    import torch

    from moda_bench.kernels.moda.fa4.overlap import same_share_bwd_programs
    from moda_bench.kernels.moda.validate import cute_bwd_shape_problem
    if base.bwd_depth != "persist" or base.bwd_depth_ctas <= 0:
        raise ValueError(f"bwd_kernel tunes moda-overlap's backward depth kernel; the base config has bwd_depth="
                         f"{base.bwd_depth!r}, bwd_depth_ctas={base.bwd_depth_ctas}")
    other = "triton" if base.bwd_depth_kernel == "cute" else "cute"
    if other == "cute" and cute_bwd_shape_problem(shape, torch.bfloat16) is not None:
        return [base]
    return [base, base.replace(bwd_depth_kernel=other,
                               bwd_depth_ctas=same_share_bwd_programs(base.bwd_depth_ctas, other))]


def _row_choices(gp: int) -> tuple[int, ...]:
    """Row-block values: multiples of GP that are >= GP (GP itself when GP > 128)."""
    vals = tuple(v for v in ROW_BLOCKS if v >= gp and v % gp == 0)
    return vals if vals else (gp,)


def search_space(shape: MoDAShape, kernel: str, base: MoDAConfig) -> list[MoDAConfig]:
    """Every combination of `kernel`'s fields on top of `base` (unpruned, no duplicates).

    fwd with L > 0 tries depth_sub 0 (auto) and block_m // GP (one dense tile, the paper's
    kernel); as the dq pass shares depth_sub, a dense candidate raises bwd_q_block_m to at
    least block_m so that its positions stay divisible. bwd_kv's row block tiles query rows
    that need not align to GP.
    """
    if kernel in DEPTH_GROUPS:
        return list(dict.fromkeys(_depth_search_space(shape, kernel, base)))
    if kernel == "bwd_kernel":
        return _bwd_kernel_space(shape, base)
    if kernel in ITEM_ROWS:
        if kernel == "bwd_items" and base.bwd_depth_kernel == "cute":  # Triton's items: nothing to move
            return [base]
        if base.fwd_depth != "persist":
            raise ValueError(f"{kernel} tunes moda-overlap's streaming items; the base config's fwd_depth is "
                             f"{base.fwd_depth!r}, not 'persist'")
        gp = group_pad(shape.G)
        rows = sorted({max(m, gp) for m in ITEM_ROWS[kernel]})
        out = [base] + [base.replace(**dict(zip(KERNEL_FIELDS[kernel], vals)))
                        for vals in itertools.product(rows, ITEM_STAGES, ITEM_WARPS)]
        return list(dict.fromkeys(out))
    if kernel in OVERLAP_GROUPS:
        name = KERNEL_FIELDS[kernel][0]
        n0 = getattr(base, name)
        if n0 <= 0:
            raise ValueError(f"{kernel} tunes around a program count; the base config has {name}={n0}")
        counts = [n0] + sorted({max(2, round(n0 * f)) for f in CTAS_FACTORS} - {n0})
        return [base.replace(**{name: n}) for n in counts]
    gp = group_pad(shape.G)
    rows = _row_choices(gp)
    out: list[MoDAConfig] = []
    if kernel == "fwd":
        regs = MAXNREG if base.fwd_depth == "tma" else (base.fwd_maxnreg,)
        for m, n, w, s, r in itertools.product(rows, COL_BLOCKS, WARPS, STAGES, regs):
            cfg = base.replace(block_m=m, block_n=n, num_warps=w, num_stages=s, depth_sub=0, fwd_maxnreg=r)
            if shape.L == 0:  # depth fields unused: keep the base's block_l
                out.append(cfg)
                continue
            dense = m // gp
            for bl in DEPTH_BLOCKS:
                out.append(cfg.replace(block_l=bl))
                if dense != auto_depth_sub(shape.G, m):
                    out.append(cfg.replace(block_l=bl, depth_sub=dense,
                                           bwd_q_block_m=max(base.bwd_q_block_m, m)))
    elif kernel in ("bwd_q", "bwd_kv"):
        names = KERNEL_FIELDS[kernel]
        tma = base.bwd_depth == "tma"
        regs = MAXNREG if tma else (getattr(base, names[4]),)
        beside = tuple(dict.fromkeys((base.bwd_kv_beside, 0, 1, 2))) if tma else (base.bwd_kv_beside,)
        chunk = tuple(dict.fromkeys((base.bwd_kv_chunk, 0))) if tma else (base.bwd_kv_chunk,)
        items = tuple(dict.fromkeys((base.bwd_depth_items, 1))) if tma and shape.L else (base.bwd_depth_items,)
        heads = (base.bwd_dq_heads,)
        if tma and kernel == "bwd_q" and dq_heads_possible(shape.L, shape.G):
            heads += (int(not dq_heads(base, shape.T, shape.L, shape.G)),)  # the other dq pass than the base's
        for vals in itertools.product(rows if kernel == "bwd_q" else ROW_BLOCKS, COL_BLOCKS, WARPS, STAGES, regs,
                                      *([beside, chunk, items] if kernel == "bwd_kv" else [heads])):
            c = base.replace(**dict(zip(names, vals)))
            if not one_launch_problem(c):  # one launch only where both passes share their options
                out.append(c)
    else:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    return list(dict.fromkeys(out))


def prune_candidates(shape: MoDAShape, kernel: str, base: MoDAConfig, *, dtype="bfloat16",
                     smem_limit: int = DEFAULT_SMEM_BYTES, max_regs: float = MAX_REGS_PER_THREAD
                     ) -> tuple[list[MoDAConfig], dict]:
    """`base` followed by every search-space config that survives pruning.

    `base` (the current best, at first the default) is never pruned: the estimates are
    coarse, and the search must always be able to fall back to it. Returns (configs, stats)
    with stats = {space, pruned, reasons: {category: count}}.
    """
    elem = element_bytes(dtype)
    space = search_space(shape, kernel, base)
    survivors, reasons = [base], {}
    for cfg in space:
        why = prune_reason(cfg, shape, kernel, elem=elem, smem_limit=smem_limit, max_regs=max_regs)
        if why is None:
            if cfg != base:
                survivors.append(cfg)
        else:
            kind = why.split(":")[0]
            reasons[kind] = reasons.get(kind, 0) + 1
    return survivors, {"space": len(space), "pruned": sum(reasons.values()), "reasons": reasons}


def candidate_configs(shape: MoDAShape, kernel: str, base: MoDAConfig, *, dtype="bfloat16",
                      budget: int = DEFAULT_BUDGET, smem_limit: int = DEFAULT_SMEM_BYTES,
                      max_regs: float = MAX_REGS_PER_THREAD, seed: int = 0) -> tuple[list[MoDAConfig], dict]:
    """First-round candidates: `base`, then a seeded (reproducible) random sample of the
    pruned space; all of it if it fits `budget`, else half the budget (the other half goes to
    neighbours of the first round's best, see `tune_kernel`). Returns (configs, stats)."""
    survivors, stats = prune_candidates(shape, kernel, base, dtype=dtype, smem_limit=smem_limit, max_regs=max_regs)
    budget = max(1, int(budget))
    rest = survivors[1:]
    if len(rest) > budget - 1:
        n = max(0, (budget + 1) // 2 - 1)
        lead = []
        if kernel in DEPTH_GROUPS:  # one candidate per other placement (and launch order) first
            names = KERNEL_FIELDS[kernel]
            lead = (neighbours(base, rest, kernel, only=names[0])
                    + neighbours(base, rest, kernel, only=names[-1]))[:budget - 1]
        pool = [c for c in rest if c not in lead]
        rest = lead + random.Random(seed).sample(pool, max(0, n - len(lead)))
    chosen = survivors[:1] + rest
    stats = dict(stats, survivors=len(survivors), kept=len(chosen))
    return chosen, stats


def neighbours(cfg: MoDAConfig, pool: Iterable[MoDAConfig], kernel: str,
               only: Optional[str] = None) -> list[MoDAConfig]:
    """Configs of `pool` that differ from `cfg` in exactly one of `kernel`'s fields (`only`:
    that field), taken round-robin over the fields so that a short list still varies each.
    Fields that either config's depth placement does not use are not compared (a 'stream'
    candidate's fused neighbour is the fused config, whatever the stream launch's warps)."""
    names = KERNEL_FIELDS[kernel]
    unused = UNUSED_BY_PLACEMENT.get(kernel, {})
    ignore = lambda c: unused.get(getattr(c, names[0]), ())  # noqa: E731 - fields c's placement ignores
    skip_cfg = ignore(cfg)
    by_field: dict[str, list[MoDAConfig]] = {n: [] for n in names}
    for c in pool:
        skip = set(skip_cfg) | set(ignore(c))
        diff = [n for n in names if n not in skip and getattr(c, n) != getattr(cfg, n)]
        if len(diff) == 1 and (only is None or diff[0] == only):
            by_field[diff[0]].append(c)
    out = []
    for group in itertools.zip_longest(*by_field.values()):
        out.extend(c for c in group if c is not None)
    return out
