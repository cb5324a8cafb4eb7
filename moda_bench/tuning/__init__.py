"""Autotuning of the fused MoDA kernel: search spaces, pruning, the search, and a persistent
JSON cache of winners that `resolve_config` consults through `install_cache_lookup`.

Search spaces (one group of MoDAConfig fields each, tuned one after another in this order):
  fwd_depth where the forward's depth phase runs (fwd_depth: split / stream / fused / overlap)
          and, for the depth-only launch of split/stream, depth_block_m x depth_warps (x
          depth_after, the launch order of "stream"); timed on the forward pass. Skipped
          when L = 0;
  bwd_depth the same for the backward's depth part: bwd_depth x bwd_depth_block_m x
          bwd_depth_warps x bwd_block_l x bwd_depth_stages x bwd_depth_after (fields a
          placement does not use stay at the base's values); timed on the backward pass.
          Skipped when L = 0;
  fwd     block_m (chunk C, rows) x block_n x num_warps x num_stages x depth_sub x block_l,
          timed on the forward pass (no grad), backward fields at their defaults;
  bwd_q   dq / depth-grad pass: bwd_q_block_m x bwd_q_block_n x bwd_q_warps x bwd_q_stages,
          timed on the backward pass with the forward winner fixed;
  bwd_kv  dk/dv pass: bwd_kv_block_m x bwd_kv_block_n x bwd_kv_warps x bwd_kv_stages,
          timed on the backward pass with the fwd and bwd_q winners fixed.
The backward passes cannot be timed apart (one `.backward()` runs both kernels), so the bwd_q,
bwd_kv and bwd_depth searches each time the whole backward while only their own fields change.
The two depth groups start with one candidate per placement (the base's other fields), since
the placement decides most of what the depth part costs; the tile groups start with a seeded
random sample.

Pruning (before anything compiles): row blocks must be multiples of GP = next_pow2(G) and at
least GP; an estimate of shared memory (q/k/v/depth tiles x stages x element bytes) must fit
the device's opt-in limit; fp32 tiles live per thread must fit a 255-register budget; tiles
larger than the problem (block_n > next_pow2(T), block_l > next_pow2(L), block_m >
next_pow2(T*GP)) are dropped unless they are the smallest choice. The estimates are coarse:
a config that passes them and still fails to compile is skipped by the search.

Cache: one JSON file {"schema_version": N, "entries": {key: entry}}. The key holds the GPU
name, triton version, dtype, d, G, L and a power-of-two bucket of T (T in (2^(k-1), 2^k] ->
2^k), so a T sweep re-uses one tuning per octave instead of tuning every length (B and Hk
only change the grid size and are not part of the key). Entries store the winning config,
default vs tuned ms (fwd+bwd), the date and the tuning wall time. Location: explicit path, else
$MODA_BENCH_TUNING_CACHE, else the platform cache dir (Linux $XDG_CACHE_HOME or ~/.cache,
macOS ~/Library/Caches, Windows %LOCALAPPDATA%) + moda-bench/tuning.json. A corrupt file, a
different schema version or an entry whose config no longer validates is ignored with a
warning. Writes are atomic (temporary file + os.replace).
"""
from __future__ import annotations

import datetime as _dt
import itertools
import json
import os
import random
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, Iterable, Optional

import triton

from moda_bench.ops.moda.config import DEPTH_MODES, MoDAConfig, auto_depth_sub, default_config, group_pad, set_config_lookup
from moda_bench.ops.moda.validate import MoDAShape

SCHEMA_VERSION = 1
ENV_CACHE = "MODA_BENCH_TUNING_CACHE"
ENV_NO_TUNING = "MODA_BENCH_NO_TUNING"
TILE_KERNELS = ("fwd", "bwd_q", "bwd_kv")
DEPTH_GROUPS = ("fwd_depth", "bwd_depth")
KERNELS = DEPTH_GROUPS + TILE_KERNELS  # tuning order
DEFAULT_BUDGET = 40
DEFAULT_SMEM_BYTES = 232448  # H100 / H200 opt-in shared memory per block (227 KiB)
MAX_REGS_PER_THREAD = 255

# Search values (the brief's spaces); row blocks are further filtered by GP.
ROW_BLOCKS = (32, 64, 128)
COL_BLOCKS = (32, 64, 128)
WARPS = (4, 8)
STAGES = (1, 2, 3, 4)
DEPTH_BLOCKS = (16, 32, 64)
DEPTH_WARPS = (2, 4, 8)  # the depth-only launches are memory-bound: fewer warps can pay
BWD_DEPTH_STAGES = (1, 2)

# Which MoDAConfig fields each kernel owns: (row block, column block, warps, stages).
KERNEL_FIELDS = {
    "fwd": ("block_m", "block_n", "num_warps", "num_stages", "depth_sub", "block_l"),
    "bwd_q": ("bwd_q_block_m", "bwd_q_block_n", "bwd_q_warps", "bwd_q_stages"),
    "bwd_kv": ("bwd_kv_block_m", "bwd_kv_block_n", "bwd_kv_warps", "bwd_kv_stages"),
    # depth groups: placement first, then the fields of the depth-only launch
    "fwd_depth": ("fwd_depth", "depth_block_m", "depth_warps", "depth_after"),
    "bwd_depth": ("bwd_depth", "bwd_depth_block_m", "bwd_depth_warps", "bwd_block_l", "bwd_depth_stages",
                  "bwd_depth_after"),
}
# Fields each placement leaves unused (they stay at the base's value in the search space).
_UNUSED_BY_PLACEMENT = {
    "fwd_depth": {"split": ("depth_after",), "fused": ("depth_block_m", "depth_warps", "depth_after"),
                  "overlap": ("depth_block_m", "depth_warps", "depth_after")},
    "bwd_depth": {"split": ("bwd_depth_after",), "fused": ("bwd_depth_block_m", "bwd_depth_warps", "bwd_depth_after"),
                  "overlap": ("bwd_depth_warps", "bwd_depth_after")},
}


# ----------------------------------------------------------------------------- small helpers

def dtype_name(dtype) -> str:
    """'bfloat16' for torch.bfloat16 or 'bfloat16'; the cache and CSVs use this spelling."""
    s = str(dtype)
    return s[len("torch."):] if s.startswith("torch.") else s


def element_bytes(dtype) -> int:
    return {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}.get(dtype_name(dtype), 2)


def t_bucket(T: int) -> int:
    """Power-of-two bucket of a sequence length: the smallest 2^k >= T."""
    return 1 << (max(int(T), 1) - 1).bit_length()


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
    bwd_q:  q, do (m, d) + stages x max(k, v (n, d), depth k/v (NB, block_l, d)).
    bwd_kv: k, v (n, d) + stages x (q, do (m, d) + fp32 lse, delta (m,)).
    "stages" counts pipeline buffers: max(1, num_stages - 1), as Triton's NVIDIA pipeliner
    allocates for loads feeding a dot.
    """
    d = shape.d
    if kernel in ("fwd", "bwd_q"):
        if kernel == "fwd":
            m, n, S, resident = cfg.block_m, cfg.block_n, _buffers(cfg.num_stages), 1
        else:
            m, n, S, resident = cfg.bwd_q_block_m, cfg.bwd_q_block_n, _buffers(cfg.bwd_q_stages), 2
        depth = 2 * depth_tiles(cfg, shape.G, m) * cfg.block_l * d if shape.L > 0 else 0
        return elem * (resident * m * d + S * max(2 * n * d, depth))
    if kernel == "bwd_kv":
        m, n, S = cfg.bwd_kv_block_m, cfg.bwd_kv_block_n, _buffers(cfg.bwd_kv_stages)
        return elem * 2 * n * d + S * (elem * 2 * m * d + 4 * 2 * m)
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")


def fp32_regs_per_thread(cfg: MoDAConfig, shape: MoDAShape, kernel: str) -> float:
    """fp32 accumulator/score elements live per thread (a register-pressure estimate).

    fwd:    acc (m, d) + scores (m, max(n, block_l)).
    bwd_q:  dq (m, d) + scores and dP (m, max(n, block_l)).
    bwd_kv: dk, dv (n, d) + scores and dP (n, m).
    """
    d = shape.d
    cols = lambda n: max(n, cfg.block_l) if shape.L > 0 else n  # noqa: E731
    if kernel == "fwd":
        m, n, w = cfg.block_m, cfg.block_n, cfg.num_warps
        return (m * d + m * cols(n)) / (32 * w)
    if kernel == "bwd_q":
        m, n, w = cfg.bwd_q_block_m, cfg.bwd_q_block_n, cfg.bwd_q_warps
        return (m * d + 2 * m * cols(n)) / (32 * w)
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
            props = torch.cuda.get_device_properties(idx)
            return int(getattr(props, "shared_memory_per_block_optin", 0) or default)
    except Exception:  # pragma: no cover - a broken driver only costs the estimate
        pass
    return default


# ----------------------------------------------------------------------------- validation / pruning

def config_problems(cfg: MoDAConfig, G: int) -> list[str]:
    """Why `cfg` cannot run for group size G (empty list = valid).

    Integer fields, then the kernel's own rule (`moda.check_config`: row blocks powers of two
    >= 16 and multiples of GP, depth_sub dividing both row blocks' positions, ...). Nothing
    here depends on the GPU or on T, so it also decides whether a cached entry is stale.
    """
    from moda_bench.ops.moda.kernel import check_config  # lazy: moda may import this module
    bad = [f"{f.name}={getattr(cfg, f.name)!r} is not a positive integer" for f in fields(cfg)
           if f.type in (int, "int")
           and (type(getattr(cfg, f.name)) is not int or getattr(cfg, f.name) < (0 if f.name == "depth_sub" else 1))]
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
    return []


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
    if n > max(min(COL_BLOCKS), triton.next_power_of_2(shape.T)):
        return f"oversized: {n_name}={n} > next_pow2(T={shape.T})"
    return _oversized_depth_cols("block_l", cfg.block_l, shape) if kernel == "fwd" else None


def _oversized_rows(name: str, m: int, shape: MoDAShape) -> Optional[str]:
    """A row block larger than the problem's folded rows (r = t*GP + g), unless it is the smallest."""
    rows = shape.T * group_pad(shape.G)
    if m > max(min(ROW_BLOCKS), triton.next_power_of_2(rows)):
        return f"oversized: {name}={m} > next_pow2(T*GP={rows})"
    return None


def _oversized_depth_cols(name: str, bl: int, shape: MoDAShape) -> Optional[str]:
    """A depth column block larger than L (L > 0), unless it is the smallest."""
    if shape.L > 0 and bl > max(min(DEPTH_BLOCKS), triton.next_power_of_2(shape.L)):
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
    for mode in DEPTH_MODES:
        unused = _UNUSED_BY_PLACEMENT[kernel].get(mode, ())
        axes = [(n, (getattr(base, n),) if n in unused else values[n]) for n in names[1:]]
        for combo in itertools.product(*(v for _, v in axes)):
            out.append(base.replace(**{names[0]: mode}, **dict(zip((n for n, _ in axes), combo))))
    return out


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
    gp = group_pad(shape.G)
    rows = _row_choices(gp)
    out: list[MoDAConfig] = []
    if kernel == "fwd":
        for m, n, w, s in itertools.product(rows, COL_BLOCKS, WARPS, STAGES):
            cfg = base.replace(block_m=m, block_n=n, num_warps=w, num_stages=s, depth_sub=0)
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
        for vals in itertools.product(rows if kernel == "bwd_q" else ROW_BLOCKS, COL_BLOCKS, WARPS, STAGES):
            out.append(base.replace(**dict(zip(names, vals))))
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
    unused = _UNUSED_BY_PLACEMENT.get(kernel, {})
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


# ----------------------------------------------------------------------------- search

@dataclass
class KernelSearch:
    """Outcome of tuning one kernel: best config and ms, the base's ms, what was tried."""

    kernel: str
    best: Optional[MoDAConfig]
    best_ms: float
    base_ms: float
    tried: int = 0
    skipped: list[tuple[dict, str]] = field(default_factory=list)

    def summary(self) -> dict:
        return {"best_ms": self.best_ms, "base_ms": self.base_ms, "tried": self.tried, "skipped": len(self.skipped)}


def search(kernel: str, candidates: list[MoDAConfig], time_fn: Callable[[MoDAConfig], float],
           on_done: Optional[Callable[[MoDAConfig, Optional[float], Optional[str]], None]] = None,
           into: Optional[KernelSearch] = None) -> KernelSearch:
    """Time every candidate with time_fn(cfg) -> ms; exceptions skip the candidate (noted).

    Without `into`, candidates[0] is the base configuration and if it fails the search fails
    (RuntimeError). With `into`, results are merged into that earlier search.
    """
    ks = into or KernelSearch(kernel, None, float("inf"), float("nan"))
    for i, cfg in enumerate(candidates):
        try:
            ms = float(time_fn(cfg))
            if not ms > 0 or ms == float("inf"):  # NaN / nonsense timing
                raise RuntimeError(f"invalid time {ms}")
        except Exception as exc:  # compile errors, out of resources, wrong results
            msg = str(exc).strip().splitlines()
            note = f"{type(exc).__name__}: {msg[0] if msg else ''}"[:200]
            if i == 0 and into is None:
                raise RuntimeError(f"{kernel}: the base configuration fails ({note})") from exc
            ks.skipped.append((cfg.to_dict(), note))
            if on_done:
                on_done(cfg, None, note)
            _free_cuda_memory()
            continue
        ks.tried += 1
        if i == 0 and into is None:
            ks.base_ms = ms
        if ms < ks.best_ms:
            ks.best, ks.best_ms = cfg, ms
        if on_done:
            on_done(cfg, ms, None)
    return ks


def tune_kernel(shape: MoDAShape, kernel: str, base: MoDAConfig, time_fn: Callable[[MoDAConfig], float], *,
                dtype="bfloat16", budget: int = DEFAULT_BUDGET, smem_limit: int = DEFAULT_SMEM_BYTES,
                seed: int = 0, on_plan: Optional[Callable[[str, int, dict], None]] = None,
                on_done: Optional[Callable[[MoDAConfig, Optional[float], Optional[str]], None]] = None
                ) -> KernelSearch:
    """Tune one kernel's fields on top of `base` with at most `budget` timed candidates:
    round 1 times `candidate_configs`; then, while budget is left (the space exceeds it), each
    further round times the untried pruned configs one field away from the best so far (a hill
    climb that stops when the best has no untried neighbour)."""
    survivors, _ = prune_candidates(shape, kernel, base, dtype=dtype, smem_limit=smem_limit)
    first, stats = candidate_configs(shape, kernel, base, dtype=dtype, budget=budget, smem_limit=smem_limit,
                                     seed=seed)
    planned = min(max(1, budget), len(survivors))
    if on_plan:
        on_plan(kernel, planned, stats)
    ks = search(kernel, first, time_fn, on_done=on_done)
    seen = set(first)
    left = planned - len(first)
    while left > 0:
        batch = [c for c in neighbours(ks.best, survivors, kernel) if c not in seen][:left]
        if not batch:
            break
        seen.update(batch)
        left -= len(batch)
        search(kernel, batch, time_fn, on_done=on_done, into=ks)
    return ks


def _free_cuda_memory() -> None:
    try:
        import torch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # pragma: no cover
        pass


class Timer:
    """What the tuner needs from a device: ms of a config for pass 'fwd' | 'bwd' | 'fwdbwd'."""

    def time(self, cfg: MoDAConfig, pass_: str, final: bool = False) -> float:  # pragma: no cover
        """final=True: the default-vs-tuned comparison (longer timing, candidates already checked)."""
        raise NotImplementedError


class CudaTimer(Timer):
    """Times `moda_attention` with an explicit config through sweeps.timing.measure
    (`attention`, `measure_fn` and `device` are replaceable for tests on the CPU).

    Before timing, each candidate's output (fwd) or gradients (bwd) are compared with the
    default config's; a relative error above `tol` raises, so a wrong config is skipped.
    """

    def __init__(self, shape: MoDAShape, dtype, *, device="cuda", warmup_ms: float = 10, rep_ms: float = 50,
                 final_warmup_ms: float = 25, final_rep_ms: float = 100, tol: float = 2e-2, seed: int = 0,
                 attention: Optional[Callable] = None, measure_fn: Optional[Callable] = None):
        import torch

        from moda_bench.timing import make_inputs
        if attention is None:
            from moda_bench.ops.moda.kernel import moda_attention as attention
        if measure_fn is None:
            from moda_bench.timing import measure as measure_fn
        self.torch, self.attention, self.measure_fn = torch, attention, measure_fn
        self.shape, self.tol = shape, tol
        self.warmup_ms, self.rep_ms = warmup_ms, rep_ms
        self.final_warmup_ms, self.final_rep_ms = final_warmup_ms, final_rep_ms
        tdtype = getattr(torch, dtype_name(dtype))
        self.inputs = make_inputs(shape.B, shape.T, shape.Hq, shape.Hk, shape.d, shape.L, dtype=tdtype,
                                  device=device, requires_grad=True, seed=seed)
        self._ref: dict[str, list] = {}
        self._ref_cfg = default_config(shape, dtype)

    def _forward(self, cfg: MoDAConfig):
        x = self.inputs
        return lambda: self.attention(x["q"], x["k"], x["v"], x["k_depth"], x["v_depth"], config=cfg)

    def _results(self, cfg: MoDAConfig, kind: str) -> list:
        from moda_bench.timing import grad_inputs
        torch = self.torch
        if kind == "fwd":
            with torch.no_grad():
                return [self._forward(cfg)().detach()]
        leaves = grad_inputs(self.inputs)
        for t in leaves:
            t.grad = None
        self._forward(cfg)().backward(self.inputs["do"])
        grads = [t.grad.detach().clone() for t in leaves]
        for t in leaves:
            t.grad = None
        return grads

    def check(self, cfg: MoDAConfig, kind: str) -> None:
        """Raise ValueError if cfg's fwd output / gradients differ from the default config's."""
        from moda_bench.timing import max_rel_err
        if kind not in self._ref:
            self._ref[kind] = self._results(self._ref_cfg, kind)
        if cfg == self._ref_cfg:
            return
        for got, ref in zip(self._results(cfg, kind), self._ref[kind]):
            err = max_rel_err(got, ref)
            if not err <= self.tol:
                raise ValueError(f"wrong result: relative error {err:.3g} vs default config > {self.tol}")

    def time(self, cfg: MoDAConfig, pass_: str, final: bool = False) -> float:
        from moda_bench.timing import grad_inputs, make_pass_fn
        if not final:
            self.check(cfg, "fwd" if pass_ == "fwd" else "bwd")
        fn = make_pass_fn(self._forward(cfg), self.inputs, pass_)
        grads = None if pass_ == "fwd" else grad_inputs(self.inputs)
        res = self.measure_fn(fn, grad_to_none=grads, warmup_ms=self.final_warmup_ms if final else self.warmup_ms,
                      rep_ms=self.final_rep_ms if final else self.rep_ms)
        return res["median_ms"]


@dataclass
class TuneResult:
    """The tuned config of one shape and how it compares with the default (fwd+bwd ms)."""

    shape: MoDAShape
    dtype: str
    config: MoDAConfig
    default_ms: float
    tuned_ms: float
    wall_s: float
    kernels: dict = field(default_factory=dict)  # kernel -> KernelSearch
    notes: list[str] = field(default_factory=list)  # skipped candidates: kernels[k].skipped

    @property
    def speedup(self) -> float:
        return self.default_ms / self.tuned_ms if self.tuned_ms > 0 else float("nan")

    def cache_entry(self, gpu: Optional[str] = None, triton_version: Optional[str] = None) -> dict:
        s = self.shape
        return {
            "gpu": gpu or current_gpu_name(), "triton_version": triton_version or triton.__version__,
            "dtype": self.dtype, "d": s.d, "G": s.G, "L": s.L, "T_bucket": t_bucket(s.T),
            "tuned_shape": {"B": s.B, "T": s.T, "Hq": s.Hq, "Hk": s.Hk, "d": s.d, "L": s.L},
            "config": self.config.to_dict(), "default_config": default_config(s, self.dtype).to_dict(),
            "pass": "fwdbwd", "default_ms": self.default_ms, "tuned_ms": self.tuned_ms,
            "speedup": self.speedup,
            "kernels": {k: ks.summary() for k, ks in self.kernels.items()},
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "tuning_wall_s": round(self.wall_s, 3),
        }


def tune_shape(shape: MoDAShape, dtype, timer: Timer, *, kernels: Iterable[str] = KERNELS,
               budget: int = DEFAULT_BUDGET, smem_limit: Optional[int] = None, seed: int = 0,
               on_plan: Optional[Callable[[str, int, dict], None]] = None,
               on_done: Optional[Callable[[MoDAConfig, Optional[float], Optional[str]], None]] = None) -> TuneResult:
    """Tune `kernels` one after another (fwd and fwd_depth timed on 'fwd', the others on
    'bwd'; the depth groups are skipped when L = 0), then time the default and the tuned
    config on fwd+bwd. The tuned config is kept only if it is faster
    there; otherwise the default is recorded (speedup 1).
    """
    t0 = time.perf_counter()
    dtype = dtype_name(dtype)
    smem_limit = device_smem_limit() if smem_limit is None else smem_limit
    default = default_config(shape, dtype)
    cfg, results, notes = default, {}, []
    for kernel in kernels:
        if kernel in DEPTH_GROUPS and shape.L == 0:
            continue  # no depth part to place
        pass_ = "fwd" if kernel in ("fwd", "fwd_depth") else "bwd"
        ks = tune_kernel(shape, kernel, cfg, lambda c, p=pass_: timer.time(c, p), dtype=dtype, budget=budget,
                         smem_limit=smem_limit, seed=seed, on_plan=on_plan, on_done=on_done)
        results[kernel] = ks
        cfg = ks.best
    default_ms = timer.time(default, "fwdbwd", final=True)
    tuned_ms = default_ms if cfg == default else timer.time(cfg, "fwdbwd", final=True)
    if tuned_ms >= default_ms:
        if cfg != default:
            notes.append(f"tuned config not faster on fwd+bwd ({tuned_ms:.4g} >= {default_ms:.4g} ms): keeping default")
        cfg, tuned_ms = default, default_ms
    return TuneResult(shape, dtype, cfg, default_ms, tuned_ms, time.perf_counter() - t0, results, notes)


# ----------------------------------------------------------------------------- cache: keys and paths

_gpu_names: dict[int, str] = {}
_cuda_ok: Optional[bool] = None


def _current_device() -> int:
    """Current CUDA device index, -1 without CUDA (availability checked once)."""
    global _cuda_ok
    try:
        import torch
        if _cuda_ok is None:
            _cuda_ok = bool(torch.cuda.is_available())
        return torch.cuda.current_device() if _cuda_ok else -1
    except Exception:  # pragma: no cover - a broken driver means no GPU to key on
        return -1


def current_gpu_name() -> str:
    """Name of the current CUDA device (memoised per index), 'cpu' without CUDA."""
    idx = _current_device()
    if idx < 0:
        return "cpu"
    name = _gpu_names.get(idx)
    if name is None:
        import torch
        name = _gpu_names[idx] = torch.cuda.get_device_name(idx)
    return name


def cache_key(shape: MoDAShape, dtype, *, gpu: Optional[str] = None, triton_version: Optional[str] = None) -> str:
    """'<gpu>|triton <ver>|<dtype>|d<d>|G<G>|L<L>|T<=<2^k>' (T bucketed to a power of two)."""
    gpu = current_gpu_name() if gpu is None else gpu
    ver = triton.__version__ if triton_version is None else triton_version
    return f"{gpu}|triton {ver}|{dtype_name(dtype)}|d{shape.d}|G{shape.G}|L{shape.L}|T<={t_bucket(shape.T)}"


def default_cache_path() -> Path:
    """Platform cache location of tuning.json (ignores the environment override)."""
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    elif sys.platform.startswith("win"):
        base = Path(os.environ.get("LOCALAPPDATA") or (Path.home() / "AppData" / "Local"))
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or (Path.home() / ".cache"))
    return base / "moda-bench" / "tuning.json"


def resolve_cache_path(path=None) -> Path:
    """Explicit path, else $MODA_BENCH_TUNING_CACHE, else `default_cache_path()`."""
    if path:
        return Path(path).expanduser()
    env = os.environ.get(ENV_CACHE)
    return Path(env).expanduser() if env else default_cache_path()


_ENV_INPUTS = (ENV_CACHE, "XDG_CACHE_HOME", "LOCALAPPDATA", "HOME", "USERPROFILE")
_resolved: dict[tuple, Path] = {}


def _cache_path_now() -> Path:
    """resolve_cache_path(None), memoised on the environment variables it reads (hot path)."""
    key = (sys.platform,) + tuple(os.environ.get(v) for v in _ENV_INPUTS)
    p = _resolved.get(key)
    if p is None:
        p = _resolved[key] = resolve_cache_path(None)
    return p


# ----------------------------------------------------------------------------- cache: read / write

def load_cache(path=None) -> dict:
    """Entries {key: entry} of the cache file; {} (with a warning) if corrupt or of another schema."""
    p = resolve_cache_path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        warnings.warn(f"moda-bench tuning cache {p} unreadable ({exc}); ignoring it", stacklevel=2)
        return {}
    return _parse(text, p)


def _parse(text: str, p: Path) -> dict:
    try:
        data = json.loads(text)
    except ValueError as exc:
        warnings.warn(f"moda-bench tuning cache {p} is corrupt ({exc}); ignoring it", stacklevel=3)
        return {}
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
        warnings.warn(f"moda-bench tuning cache {p} has no 'entries' table; ignoring it", stacklevel=3)
        return {}
    if data.get("schema_version") != SCHEMA_VERSION:
        warnings.warn(f"moda-bench tuning cache {p} has schema version {data.get('schema_version')!r}, "
                      f"expected {SCHEMA_VERSION}; ignoring it (re-run `moda-bench tune`)", stacklevel=3)
        return {}
    return data["entries"]


def atomic_write_json(path: Path, data: dict) -> None:
    """Write JSON to a temporary file beside `path`, fsync, then os.replace (never half-written)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def save_entries(new: dict, path=None) -> Path:
    """Merge {key: entry} into the cache file (re-read just before writing) atomically."""
    p = resolve_cache_path(path)
    entries = load_cache(p)
    entries.update(new)
    atomic_write_json(p, {"schema_version": SCHEMA_VERSION, "entries": entries})
    _reader.invalidate()
    return p


def save_result(result: TuneResult, path=None) -> tuple[str, Path]:
    """Persist one TuneResult under its cache key; returns (key, path)."""
    key = cache_key(result.shape, result.dtype)
    return key, save_entries({key: result.cache_entry()}, path)


def entry_config(entry: dict, G: int, key: str = "") -> Optional[MoDAConfig]:
    """The entry's MoDAConfig, or None with a warning if it no longer validates (stale)."""
    try:
        cfg = MoDAConfig.from_dict(entry["config"])
        probs = config_problems(cfg, G)
    except Exception as exc:
        probs = [f"{type(exc).__name__}: {exc}"]
    if probs:
        warnings.warn(f"moda-bench tuning cache entry {key!r} is stale ({probs[0]}); using the default config",
                      stacklevel=3)
        return None
    return cfg


class _CacheReader:
    """Memoised view of one cache file: re-parsed only when its (mtime, size) changes."""

    def __init__(self):
        self.invalidate()

    def invalidate(self) -> None:
        self._path: Optional[Path] = None
        self._stamp = None
        self._entries: dict = {}
        self._configs: dict[tuple, Optional[MoDAConfig]] = {}

    def entries(self, path: Path) -> dict:
        try:
            st = os.stat(path)
            stamp = (st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        if path != self._path or stamp != self._stamp:
            self._path, self._stamp, self._configs = path, stamp, {}
            self._entries = load_cache(path) if stamp is not None else {}
        return self._entries

    def config(self, path: Path, shape: MoDAShape, dtype) -> Optional[MoDAConfig]:
        entries = self.entries(path)
        if not entries:
            return None
        memo = (shape, dtype, _current_device())
        if memo not in self._configs:
            key = cache_key(shape, dtype)
            entry = entries.get(key)
            self._configs[memo] = entry_config(entry, shape.G, key) if isinstance(entry, dict) else None
        return self._configs[memo]


_reader = _CacheReader()


def lookup(shape: MoDAShape, dtype, path=None) -> Optional[MoDAConfig]:
    """Tuned config for (shape, dtype) on the current GPU, or None. Cheap: one stat() per call."""
    return _reader.config(_cache_path_now() if path is None else Path(path), shape, dtype)


def install_cache_lookup(path=None) -> None:
    """Make `resolve_config` consult the tuning cache at `path` (None: env / platform default,
    resolved at every call so $MODA_BENCH_TUNING_CACHE may change later)."""
    fixed = Path(path).expanduser() if path else None

    def _lookup(shape: MoDAShape, dtype) -> Optional[MoDAConfig]:
        return _reader.config(_cache_path_now() if fixed is None else fixed, shape, dtype)

    _lookup.moda_tuning_cache = True  # lets callers tell the cache lookup from others
    set_config_lookup(_lookup)


def uninstall_cache_lookup() -> None:
    """Back to the heuristic default config."""
    set_config_lookup(None)
    _reader.invalidate()


def install_default_lookup() -> bool:
    """install_cache_lookup() unless $MODA_BENCH_NO_TUNING=1; returns whether it installed."""
    if os.environ.get(ENV_NO_TUNING, "0") not in ("", "0"):
        return False
    install_cache_lookup()
    return True
