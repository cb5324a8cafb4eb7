"""The streaming depth kernels' items fit the multiprocessor's shared memory (`triton.depth_smem`):
issue 60 item 4, where the overlap route's forward at G=32, d=128 asked more than an H100 has.

CPU, pure: over every G in {1,2,4,8,16,32}, d in {64,128,256}, L in {1,7,64,256} and both dtypes'
element sizes, the item `fit_fwd` / `fit_bwd` pick for the overlap route's asked items
(`fa4.overlap`) is a valid geometry no larger than asked whose bound fits Hopper's limit (and an
sm86-like 99 KiB for 16-bit inputs), and the d = 64 items (the tuned fast paths) stay as asked.
CPU, interpreter: `depth_fwd` / `depth_bwd` at G=32, d=128, T=67, L=7 (the failing GPU case, where the
forward's item is shrunk) against the fp64 depth partial / `depth_backward_reference`, bf16 at
`helpers.TOLERANCE`. CPU, slow: the kernels compiled for sm_90 without a GPU (`triton.compile`,
where this Triton can) use at most the bound, and the shrunk items fit the limit.
"""
import math

import pytest
import torch
from helpers import TOLERANCE, compiled_sm90_json, random_inputs, rel_err

from moda_bench.kernels.launch import next_pow2
from moda_bench.kernels.moda.fa4.overlap import BWD_BLOCK_M, FWD_BLOCK_M, STAGES
from moda_bench.kernels.moda.reference import depth_backward_reference
from moda_bench.kernels.moda.triton.bwd_tma_rules import bwd_depth_geometry
from moda_bench.kernels.moda.triton.depth_smem import HOPPER_SMEM, bwd_smem, fit_bwd, fit_fwd, fwd_smem
from moda_bench.kernels.moda.triton.fwd_tma import depth_geometry

SM86_SMEM = 101376
GS, DS, LS = (1, 2, 4, 8, 16, 32), (64, 128, 256), (1, 7, 64, 256)


def _asked(G: int, fwd: bool) -> int:
    return max(FWD_BLOCK_M if fwd else BWD_BLOCK_M, next_pow2(G))


def _cols(geometry) -> int:
    _, _, S, bl = geometry
    return S * bl


@pytest.mark.parametrize("limit,elems", [(HOPPER_SMEM, (2, 4)), (SM86_SMEM, (2,))])
def test_every_shape_fits(limit, elems):
    for G in GS:
        for d in DS:
            for elem in elems:
                bm, s, bl = fit_fwd(G, d, elem, limit, _asked(G, True), STAGES)
                assert fwd_smem(G, bm, d, s, elem, bl) <= limit
                assert bm <= _asked(G, True) and 1 <= s <= STAGES and bm % next_pow2(G) == 0
                geo = depth_geometry(G, bm, 0, bl)  # a geometry the kernel takes
                assert _cols(geo) <= _cols(depth_geometry(G, bm))
                for L in LS:
                    for grad in (True, False):
                        bm, s, bl = fit_bwd(G, d, L, elem, limit, _asked(G, False), STAGES, grad)
                        assert bwd_smem(G, bm, d, L, s, elem, grad, bl) <= limit
                        assert bm <= _asked(G, False) and 1 <= s <= STAGES and bm % next_pow2(G) == 0
                        geo = bwd_depth_geometry(G, bm, L, bl)
                        assert _cols(geo) <= _cols(bwd_depth_geometry(G, bm, L))


def test_fitting_items_are_kept():
    """The asked item comes back as asked wherever its bound fits: every d = 64 shape (the tuned
    items of the overlap route, 256-row forward and 64-row backward, three stages; at G <= 8 the
    four-stage forward too), the backward at d = 128; at G=32, d=128 the forward shrinks (fewer
    stages, then fewer columns)."""
    for G in GS:
        for L in LS:
            for grad in (True, False):
                for d in (64, 128):
                    assert fit_bwd(G, d, L, 2, HOPPER_SMEM, _asked(G, False), STAGES, grad) == \
                        (_asked(G, False), STAGES, 0)
        assert fit_fwd(G, 64, 2, HOPPER_SMEM, _asked(G, True), STAGES) == (_asked(G, True), STAGES, 0)
        assert fit_fwd(G, 64, 2, HOPPER_SMEM, 128, 3, 32) == (128, 3, 32)  # an asked block_l kept too
        if G <= 8:  # the tuner's deepest 256-row forward item (four stages) at d = 64
            assert fit_fwd(G, 64, 2, HOPPER_SMEM, 256, 4) == (256, 4, 0)
    assert fit_fwd(32, 128, 2, HOPPER_SMEM, 256, 3) == (256, 2, 16)
    assert fwd_smem(32, 256, 128, 3, 2) > HOPPER_SMEM  # what failed on the H100


def test_order_is_stages_then_columns_then_rows():
    G, d = 32, 128
    # the bound of the asked 256-row item: 2 stages fit only with half the columns
    assert fwd_smem(G, 256, d, 2, 2) > HOPPER_SMEM >= fwd_smem(G, 256, d, 2, 2, 16)
    # G=1 at d=256: one column a position at 256 rows (BL can not shrink), so rows halve, then columns
    assert depth_geometry(1, 256)[3] == 1
    assert fit_fwd(1, 256, 2, HOPPER_SMEM, 256, 3) == (128, 2, 16)
    # a limit nothing fits is a clear error
    with pytest.raises(ValueError, match="no streaming depth item fits"):
        fit_fwd(32, 256, 4, 4096, 256, 3)


def _depth_partial(q, kd, vd, scale):
    """fp64 (o_d, lse_d) of every row over its own position's L depth keys."""
    B, T, Hq, d = q.shape
    Hk = kd.shape[3]
    q4 = q.double().view(B, T, Hk, Hq // Hk, d)
    s = torch.einsum("bthgd,btlhd->bthgl", q4, kd.double()) * scale
    lse = torch.logsumexp(s, -1)
    o = torch.einsum("bthgl,btlhd->bthgd", torch.softmax(s, -1), vd.double())
    return o.reshape(B, T, Hq, d), lse.reshape(B, T, Hq)


def test_interpreter_g32_d128():
    """The failing GPU case's kernels (G=32, d=128, T=67, L=7, bf16) under the interpreter with the
    items the fit picks (the forward's shrunk), against fp64."""
    from moda_bench.kernels.moda.triton.depth import depth_bwd, depth_fwd
    G, T, L, d, Hk = 32, 67, 7, 128, 1
    dt = torch.bfloat16
    q, _, _, kd, vd, do = random_inputs(1, T, G * Hk, Hk, d, L, dt, seed=60)
    scale = 1.0 / math.sqrt(d)
    assert fit_fwd(G, d, 2, HOPPER_SMEM, FWD_BLOCK_M, STAGES) != (FWD_BLOCK_M, STAGES, 0)
    with torch.no_grad():
        od, lsed = depth_fwd(q, kd, vd, scale, G, 4, block_m=FWD_BLOCK_M, stages=STAGES, num_warps=8)
        o_ref, lse_ref = _depth_partial(q, kd, vd, scale)
        assert rel_err(od, o_ref) < TOLERANCE[dt]
        assert rel_err(lsed, lse_ref) < 1e-3
        # the backward given the depth partial as "the whole softmax" (the same math as the merged one)
        o, lse = o_ref.to(dt), lse_ref.float()
        for grad in (True, False):
            dq, dkd, dvd = depth_bwd(do, q, o, lse, kd, vd, scale, G, 4, depth_grad=grad, block_m=BWD_BLOCK_M,
                                     stages=STAGES)
            ref = depth_backward_reference(q, do, o, lse, kd, vd, scale)
            assert rel_err(dq, ref[0]) < TOLERANCE[dt]
            if grad:
                assert rel_err(dkd, ref[1]) < TOLERANCE[dt] and rel_err(dvd, ref[2]) < TOLERANCE[dt]
            else:
                assert dkd is None and dvd is None


def _compiled_sm90(items: list) -> list:
    """`depth.compiled_smem` of each (kind, G, bm, d, stages, bl, L, grad), compiled for sm_90 (or skip)."""
    return compiled_sm90_json("from moda_bench.kernels.moda.triton.depth import compiled_smem",
                              f"[compiled_smem(*a) for a in {items!r}]")


@pytest.mark.slow
@pytest.mark.parametrize("G,d,L,grad", [(32, 128, 7, True), (8, 64, 64, True), (16, 128, 64, False),
                                        (1, 128, 7, True), (32, 256, 256, True)])
def test_bound_covers_compiled_sm90(G, d, L, grad):
    """The bound is at least what Triton allocates, for the asked and the fitted items, and the
    fitted items fit Hopper's limit."""
    fwd = sorted({(_asked(G, True), STAGES, 0), fit_fwd(G, d, 2, HOPPER_SMEM, _asked(G, True), STAGES)})
    bwd = fit_bwd(G, d, L, 2, HOPPER_SMEM, _asked(G, False), STAGES, grad)
    items = [("fwd", G, bm, d, s, bl) for bm, s, bl in fwd] + [("bwd", G, *bwd[:1], d, *bwd[1:], L, grad)]
    used = _compiled_sm90(items)
    for (bm, s, bl), u in zip(fwd, used):
        assert u <= fwd_smem(G, bm, d, s, 2, bl)
    assert used[-1] <= bwd_smem(G, bwd[0], d, L, bwd[1], 2, grad, bwd[2]) and used[-1] <= HOPPER_SMEM
    assert used[fwd.index(fit_fwd(G, d, 2, HOPPER_SMEM, _asked(G, True), STAGES))] <= HOPPER_SMEM
