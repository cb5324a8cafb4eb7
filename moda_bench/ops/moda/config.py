"""Launch configuration of the fused MoDA kernel: `MoDAConfig`, its validity rules, and how
one is chosen for a call.

A `MoDAConfig` fixes the tile shapes of the three Triton kernels (forward, backward dq/depth
pass, backward dk/dv pass) and where the depth part runs. `resolve_config` picks one for a
call: an explicit config wins, then the installed config source (a function (shape, dtype) ->
MoDAConfig | None; `moda_bench.tuning.use()` installs the tuning cache as one), then
`default_config`, a heuristic. Nothing installs a source at import: without one, every call
gets the heuristic default. `check_config` is the kernel's rule for a valid config.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Callable, Optional

import triton

from moda_bench.ops.moda.validate import MoDAShape


# Where the depth part of a pass can run (MoDAConfig.fwd_depth / bwd_depth); the order is the
# tuner's candidate order.
DEPTH_MODES = ("split", "stream", "fused", "overlap")


@dataclass(frozen=True)
class MoDAConfig:
    """Tile shapes. Rows are (position, query-head-in-group) pairs folded as r = t*GP + g.

    block_m   C: query rows per forward program (a multiple of GP = next_pow2(G)).
    block_n   sequence keys per inner step of the forward.
    depth_sub positions per depth sub-tile; 0 = auto (fewest positions whose rows fill a
              16-row tensor-core tile, utilisation -> min(1, G/16)); block_m // GP = one
              dense masked tile over the whole chunk (the paper's group-aware kernel, G/C).
    block_l   depth columns per depth step.
    depth_stages software-pipelining depth of the (short) depth loop; 1 keeps its tiles
              out of the pipeline's shared memory, so occupancy stays that of the
              sequence loop.
    bwd_*     the same for the backward passes: dq/dkd/dvd pass (q-major) and dk/dv pass
              (kv-major).
    fwd_depth where the forward's depth phase runs: "fused" (after the sequence loop, same
              program), "split" (a depth-only launch first; the sequence kernel starts its
              online softmax from that partial), "overlap" (depth-only programs in the
              sequence kernel's grid, partials merged by a small kernel), "stream" (the
              depth-only kernel on a second CUDA stream, concurrent with the L=0 sequence
              kernel, then the merge).
    bwd_depth where the backward's depth part (its dq share, dk_depth, dv_depth) runs:
              "fused" (in the q-major pass), "split" (a depth-only launch), "overlap"
              (depth-only programs in the kv-major pass's grid, so the depth bytes stream
              while dk/dv compute), "stream" (a depth-only launch on a second CUDA stream,
              concurrent with the dk/dv pass).
    depth_after, bwd_depth_after  "stream" only: launch the depth-only kernel after the
              sequence kernel instead of before it. The sequence kernel's programs then take
              their resident slots first and the small depth programs fill what is left on
              each multiprocessor, so the depth bytes stream while the sequence part computes;
              launched first, the depth programs fill the multiprocessors and the sequence
              kernel mostly waits for them.
    depth_block_m, depth_warps  rows and warps of the forward's depth-only program ("split",
              "stream").
    bwd_depth_block_m, bwd_depth_warps, bwd_block_l, bwd_depth_stages  the same for the
              backward's depth part (its own launch, "overlap" programs, or, for block_l and
              stages, the fused q-major pass).
    reverse   visit query blocks heaviest-first (last causal block first) in the forward and
              the q-major pass.
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

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "MoDAConfig":
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown MoDAConfig fields: {sorted(unknown)}")
        return cls(**d)

    def replace(self, **kw) -> "MoDAConfig":
        return replace(self, **kw)


def group_pad(G: int) -> int:
    """GP: G rounded up to a power of two (rows of one position inside a block)."""
    return triton.next_power_of_2(G)


def auto_depth_sub(G: int, block_m: int) -> int:
    """Fewest positions whose GP rows make a 16-row MMA tile, capped at the chunk."""
    gp = group_pad(G)
    return max(1, min(block_m // gp, triton.cdiv(16, gp)))


# Up to this T the depth phase stays fused in the sequence kernels: the depth-only launches,
# side stream and merge cost a fixed ~0.1-0.3 ms that short sequences cannot hide (H200, bf16,
# G=8, L=64, fwd+bwd: T=1024 fused 0.88 ms vs split/stream 1.14 ms; T=4096 2.55 vs 2.22 ms).
FUSED_DEPTH_MAX_T = 2048


def default_config(shape: MoDAShape, dtype=None) -> MoDAConfig:
    """Heuristic used when no tuned entry exists."""
    gp = group_pad(shape.G)
    bm = max(64, gp)
    bl = min(64, max(16, triton.next_power_of_2(max(shape.L, 1))))
    cfg = MoDAConfig(block_m=bm, bwd_q_block_m=max(64, gp), block_l=bl, bwd_block_l=bl)
    if shape.T <= FUSED_DEPTH_MAX_T:
        cfg = cfg.replace(fwd_depth="fused", bwd_depth="fused")
    if shape.d > 64:
        cfg = cfg.replace(num_stages=2, bwd_q_stages=2, bwd_kv_stages=2, bwd_q_block_n=32, bwd_kv_block_m=32)
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
    """Depth sub-tile positions for a depth-only program of block_m rows: cfg.depth_sub when it
    fits that block, else the automatic one."""
    P = block_m // group_pad(G)
    s = cfg.depth_sub
    if s and P % s == 0 and s * group_pad(G) >= 16:
        return s
    return auto_depth_sub(G, block_m)


def check_config(cfg: MoDAConfig, G: int) -> None:
    """Raise ValueError if cfg cannot run for group size G."""
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
    for name in ("fwd_depth", "bwd_depth"):
        if getattr(cfg, name) not in DEPTH_MODES:
            raise ValueError(f"config {name}={getattr(cfg, name)!r} must be one of {DEPTH_MODES}")


ConfigSource = Callable[[MoDAShape, object], Optional[MoDAConfig]]
_source: Optional[ConfigSource] = None


def set_config_source(fn: Optional[ConfigSource]) -> Optional[ConfigSource]:
    """Install fn(shape, dtype) -> MoDAConfig | None as the config source of `resolve_config`
    (None: none, heuristic defaults); returns the source it replaces, for restoring it."""
    global _source
    previous, _source = _source, fn
    return previous


def config_source() -> Optional[ConfigSource]:
    """The installed config source, or None."""
    return _source


def resolve_config(shape: MoDAShape, dtype, config: Optional[MoDAConfig] = None) -> MoDAConfig:
    """Explicit config, else the installed source's answer, else the heuristic default."""
    if config is not None:
        return config
    if _source is not None:
        found = _source(shape, dtype)
        if found is not None:
            return found
    return default_config(shape, dtype)
