"""The issue-20 prototypes (experiments/fused_fwd_triton.py, experiments/fused_fwd_cute.py).

CPU (Triton interpreter, set up by conftest): route A's forward, both load paths (tensor
descriptors and pointers), against the fp64 `moda_reference` at tiny odd sizes: out and lse,
fp32 inputs (||err|| / ||ref|| < 1e-4) and one bf16 case (< 2e-2); G in {1, 2, 3, 8, 16},
L in {0, 1, odd}, T not a multiple of any block, B = 2, both depth placements, the persistent
schedule. Route B needs CUDA and flash-attn-4: its script must still give a verdict line.
"""

import pytest
import torch

from conftest import load_tool



A = load_tool("fused_fwd_triton")
DEV = "cuda" if torch.cuda.is_available() else "cpu"

# (T, G, L, d, variant): small tiles so that several row blocks, key tiles and depth steps run
CASES = [
    (37, 8, 5, 64, dict(block_m=32, block_n=16)),
    (37, 8, 5, 64, dict(block_m=32, block_n=16, use_desc=False)),
    (45, 1, 3, 32, dict(block_m=32, block_n=16)),
    (29, 3, 1, 32, dict(block_m=16, block_n=16)),
    (50, 16, 0, 32, dict(block_m=32, block_n=32)),
    (40, 2, 7, 32, dict(block_m=32, block_n=16, depth_first=True)),
    (40, 4, 4, 32, dict(block_m=32, block_n=16, persistent=True)),
    (23, 2, 9, 32, dict(block_m=16, block_n=16, use_desc=False, depth_first=True)),
]


@pytest.mark.parametrize("T,G,L,d,variant", CASES, ids=[f"T{c[0]}-G{c[1]}-L{c[2]}-d{c[3]}-{i}" for i, c in
                                                         enumerate(CASES)])
def test_route_a_fp32(T, G, L, d, variant):
    e_out, e_lse = A.check_case(lambda *a: A.moda_fused_fwd(*a, **variant), 2, T, G, 2, d, L, torch.float32, DEV,
                                seed=T + G + L)
    assert e_out < 1e-4 and e_lse < 1e-4, (e_out, e_lse)


def test_route_a_bf16_default_tiles():
    """The default variant's tiles (128 x 128) on a bf16 problem shorter than one row block."""
    e_out, e_lse = A.check_case(A.moda_fused_fwd, 1, 19, 8, 1, 64, 6, torch.bfloat16, DEV, seed=3)
    assert e_out < 2e-2 and e_lse < 2e-2, (e_out, e_lse)


def test_route_a_scale_and_no_depth_tensors():
    from moda_bench.kernels.moda import moda_reference
    q, k, v, _, _ = A.random_inputs(1, 21, 4, 2, 32, 0, torch.float32, DEV, seed=2)
    out, lse = A.moda_fused_fwd(q, k, v, scale=0.3, block_m=16, block_n=16)
    ref, ref_lse = moda_reference(q, k, v, scale=0.3, return_lse=True, out_dtype=torch.float64)
    assert A.rel_err(out, ref) < 1e-4 and A.rel_err(lse, ref_lse) < 1e-4


def test_depth_geometry():
    for G in (1, 2, 3, 8, 16, 32):
        for bm in (16, 32, 64, 128):
            gp = 1 << (G - 1).bit_length()
            if bm % gp:
                with pytest.raises(ValueError):
                    A.depth_geometry(G, bm)
                continue
            gp_, P, S, bl = A.depth_geometry(G, bm)
            assert gp_ == gp and P * gp == bm and P % S == 0
            assert S * gp >= 16 or S == P  # rows of a sub-tile fill a tensor-core tile (or the block)
            assert S * bl >= 16 and bl & (bl - 1) == 0


def test_bad_variant_and_inputs():
    q, k, v, kd, vd = A.random_inputs(1, 8, 4, 2, 32, 2, torch.float32, DEV)
    with pytest.raises(ValueError, match="unknown variant"):
        A.moda_fused_fwd(q, k, v, kd, vd, blockm=64)
    with pytest.raises(ValueError, match="block_m"):
        A.moda_fused_fwd(q, k, v, kd, vd, block_m=48)
    with pytest.raises(ValueError):
        A.moda_fused_fwd(q, k[:, :5], v, kd, vd)


def test_route_a_main_without_cuda(capsys):
    if torch.cuda.is_available():
        pytest.skip("the CPU message only")
    assert A.main([]) == 0
    assert "ROUTE A: not run" in capsys.readouterr().out


def test_route_b_verdict_without_fa4(capsys):
    """Without CUDA / FA4 the route-B script prints its verdict and exits 0."""
    B = load_tool("fused_fwd_cute")
    if B.fa4_problem() is None:
        pytest.skip("FA4 available: the GPU test below covers it")
    assert B.main([]) == 0
    assert capsys.readouterr().out.startswith("ROUTE B: not runnable:")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_route_b_gpu_smoke(capsys):
    B = load_tool("fused_fwd_cute")
    if B.fa4_problem() is not None:
        pytest.skip(f"FA4 unavailable: {B.fa4_problem()}")
    assert B.main(["--T", "2048", "--rep-ms", "5", "--warmup-ms", "2"]) == 0
    assert "ROUTE B:" in capsys.readouterr().out
