"""MoDA with the depth part streamed beside FlashAttention-4 on a reserved share of the SMs:
`moda_overlap` (the `moda-overlap` provider), i.e. `moda_fa4` under the "persist" placement;
`overlap_config`, its config per shape (a tuned entry, `moda-bench tune --op moda-overlap`, else
`overlap_heuristic`, which sizes that share from the shape).

How it runs (measurements in docs/DESIGN.md, "The overlap route"): the depth
part's persistent streaming kernels (`triton.depth`, items of folded row blocks) are launched
first on a highest-priority side stream with n programs; FA4's forward/backward, which is not
persistent, then fills the other SMs, and the two run concurrently; the LSE merge (forward) and
the dq sum (backward) follow. n is chosen so that the depth kernel on n SMs takes a little less
than FA4 on the rest: too few programs leave a depth tail after FA4, too many take SMs from it.

The program counts scale with the ratio of depth work to sequence FLOPs (`overlap_programs`; B, d
and Hk cancel), from a calibration at T=16384, G=8, L=64, d=64, bf16 on an H100: the forward's and
the backward's best shares of the GPU's SMs (FWD_SHARE, BWD_SHARE). With detached depth the
backward writes no depth gradients and takes a smaller share of programs.
"""
from __future__ import annotations

import math

from moda_bench.kernels.moda.config import MoDAConfig, group_pad, op_config, resolve_config
from moda_bench.kernels.moda.fa4.merge import cute_bwd_unavailable
from moda_bench.kernels.moda.triton.fwd_tma import num_sms
from moda_bench.kernels.moda.validate import MoDAShape, check_inputs

# The calibration point and its measured best shares of the SMs (H100, 132 SMs)
BASE_T, BASE_G, BASE_L = 16384, 8, 64
FWD_SHARE, BWD_SHARE = 12 / 132, 24 / 132
MIN_PROGRAMS = 8
DETACHED_BWD = 0.6
# The streaming kernels' items: folded row blocks of 256 rows on 8 warps (forward) and 64 rows on 4
# warps (backward), three items' tiles in flight. A depth program is a chain of small dependent
# steps with one warp per scheduler, latency-bound rather than memory-bound (its rate is flat in the
# program count), so more warps on a larger item raise its rate; the forward's 256-row items gain
# beside FA4 too. The backward's 128-row 8-warp items stream faster alone but cost more beside FA4
# at G=2 and L=256, so the backward keeps 64 rows and 4 warps (docs/DESIGN.md, "The overlap route").
# Where an item would not fit the SM's shared memory (d >= 128) the kernels run the largest that does
# (`triton.depth_smem.fit_fwd` / `fit_bwd`: fewer stages, then depth columns, then rows).
FWD_BLOCK_M, FWD_WARPS, BWD_BLOCK_M, BWD_WARPS, STAGES = 256, 8, 64, 4, 3
# The backward's depth part as the CuTe kernel of independent warps (`depth_bwd_sm90`, where it takes
# the shape): it streams about twice Triton's rate a program, so it needs fewer SMs beside FA4: a
# share of 8/132 at the calibration point, at least 12 programs. No single share was best at T=4096
# for G=8, G=2 and L=256 at once, so 8/132 stays (docs/DESIGN.md, "The depth backward in CuTe").
CUTE_BWD_SHARE, CUTE_BWD_MIN = 8 / 132, 12


def overlap_programs(shape: MoDAShape, sms: int, share: float, minimum: int = MIN_PROGRAMS) -> int:
    """Programs of a streaming depth launch: share * sms at the calibration point, scaled by the
    shape's depth work per sequence FLOP, between MIN_PROGRAMS and all SMs (rounded up: a depth
    tail after FA4 costs far more than a program too many). The depth work is its bytes below
    G = 8, ~ L / (G*T), and its rows from G = 8 on, ~ L / T: a program's item of G rows is
    compute-bound there."""
    scale = (shape.L / BASE_L) * (BASE_T / max(shape.T, 1)) * (BASE_G / min(max(shape.G, 1), BASE_G))
    return max(minimum, min(sms, math.ceil(share * sms * scale - 1e-9)))


def same_share_bwd_programs(n: int, to_kernel: str) -> int:
    """The backward program count on `to_kernel` ("cute" or "triton") that takes the share of the SMs
    n programs of the other kernel take under `overlap_heuristic` (the tuner's other-kernel candidate)."""
    if to_kernel == "cute":
        return max(CUTE_BWD_MIN, math.ceil(n * CUTE_BWD_SHARE / BWD_SHARE - 1e-9))
    return max(MIN_PROGRAMS, math.ceil(n * BWD_SHARE / CUTE_BWD_SHARE - 1e-9))


def overlap_heuristic(shape: MoDAShape, dtype=None, device=None, depth_grad: bool = True) -> MoDAConfig:
    """moda-fa4's resolved config with the "persist" placement on both passes, the side stream at
    the highest priority, the CuTe depth backward where it takes the shape (`fa4.cute_bwd_unavailable`;
    else Triton's) and the program counts of `overlap_programs` for this GPU (what
    `moda-bench tune --op moda-overlap` starts from and must beat)."""
    sms = num_sms(device)
    detached = 1.0 if depth_grad else DETACHED_BWD
    if cute_bwd_unavailable(shape, dtype, device) is None:
        kernel, bwd = "cute", overlap_programs(shape, sms, CUTE_BWD_SHARE * detached, CUTE_BWD_MIN)
    else:
        kernel, bwd = "triton", overlap_programs(shape, sms, BWD_SHARE * detached)
    return resolve_config(shape, dtype, op="moda-fa4").replace(
        fwd_depth="persist", bwd_depth="persist", side_priority=True, bwd_depth_kernel=kernel,
        depth_ctas=overlap_programs(shape, sms, FWD_SHARE), bwd_depth_ctas=bwd,
        depth_block_m=max(FWD_BLOCK_M, group_pad(shape.G)), bwd_depth_block_m=max(BWD_BLOCK_M, group_pad(shape.G)),
        depth_stages=STAGES, bwd_depth_stages=STAGES, depth_warps=FWD_WARPS, bwd_depth_warps=BWD_WARPS)


def overlap_config(shape: MoDAShape, dtype=None, device=None, depth_grad: bool = True) -> MoDAConfig:
    """moda-overlap's config: its own tuned entry for the shape (the tuning cache in use, else
    this GPU's shipped file; `config.op_config`), its backward programs scaled by DETACHED_BWD
    with detached depth; else `overlap_heuristic`."""
    tuned = op_config(shape, dtype, "moda-overlap") if shape.L > 0 else None
    if tuned is None or tuned.fwd_depth != "persist":
        return overlap_heuristic(shape, dtype, device, depth_grad)
    if not depth_grad:
        tuned = tuned.replace(bwd_depth_ctas=max(MIN_PROGRAMS, math.ceil(tuned.bwd_depth_ctas * DETACHED_BWD)))
    return tuned


def moda_overlap(q, k, v, k_depth=None, v_depth=None, *, scale: float | None = None,
                 config: MoDAConfig | None = None, return_lse: bool = False, depth_grad: bool = True, backend=None):
    """MoDA (same contract as `moda_fa4`) with the depth part on a reserved share of the SMs
    beside FA4's kernels (module docstring). `config` replaces `overlap_config`'s answer; L = 0
    is FA4 alone."""
    from moda_bench.kernels.moda.fa4.merge import moda_fa4
    if config is None:
        shape = check_inputs(q, k, v, k_depth, v_depth, need_cuda=True)
        if shape.L > 0:
            config = overlap_config(shape, q.dtype, q.device, depth_grad)
    return moda_fa4(q, k, v, k_depth, v_depth, scale=scale, config=config, return_lse=return_lse,
                    depth_grad=depth_grad, backend=backend)

