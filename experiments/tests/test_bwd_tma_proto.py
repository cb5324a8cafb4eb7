"""The issue-21 backward prototype (experiments/bwd_tma_triton.py) on the CPU interpreter.

Gradients (dq, dk, dv, dk_depth, dv_depth) of `moda_tma_bwd` against fp64 autograd of
`moda_reference` at tiny odd sizes (T not a multiple of any block, B = 2 so batch edges are
crossed), small tiles so that several row blocks, key tiles, diagonal steps and depth steps run:
the descriptor variant, the pointer variant and the atomic-dq variant (descriptor loads; the
interpreter has no descriptor reduce, so its dq goes through tl.atomic_add there), G in
{1, 2, 3, 8, 16} (3: padding rows), L in {0, 1, 5}. fp32 inputs: ||err|| / ||ref|| < 1e-4;
bf16: < 2e-2. Plus argument errors, the variant table, the CSV rows and main() without CUDA.
"""

import pytest
import torch

from conftest import load_tool



M = load_tool("bwd_tma_triton")
DEV = "cuda" if torch.cuda.is_available() else "cpu"
SMALL = dict(kv_bn=16, kv_bm=32, dq_bm=32, dq_bn=16)  # P = 32/GP positions a row block

# (T, G, L, d, variant)
CASES = [
    (33, 8, 5, 16, dict(SMALL)),                                            # P=4: 2 depth sub-tiles
    (33, 8, 5, 16, dict(SMALL, use_desc=False)),
    (33, 8, 5, 16, dict(SMALL, atomic=True)),
    (19, 1, 0, 16, dict(SMALL, kv_bn=32, kv_bm=16)),                        # 2 diagonal row steps a key tile
    (19, 1, 0, 16, dict(SMALL, atomic=True, use_desc=False)),
    (33, 2, 1, 16, dict(SMALL, dq_bm=64, dq_bn=32)),
    (33, 2, 1, 16, dict(SMALL, atomic=True, kv_bn=32)),
    (21, 3, 5, 16, dict(SMALL)),                                            # G=3: padded rows
    (21, 3, 5, 16, dict(SMALL, atomic=True)),
    (21, 3, 5, 16, dict(SMALL, use_desc=False)),
    (19, 16, 1, 16, dict(kv_bn=16, kv_bm=16, dq_bm=32, dq_bn=16)),          # P = 1 or 2 positions
]


@pytest.mark.parametrize("T,G,L,d,variant", CASES,
                         ids=[f"T{c[0]}-G{c[1]}-L{c[2]}-{'p' if c[4].get('use_desc') is False else 'd'}"
                              f"{'-at' if c[4].get('atomic') else ''}-{i}" for i, c in enumerate(CASES)])
def test_gradients_fp32(T, G, L, d, variant):
    errs = M.check_case(variant, 2, T, G, 2, d, L, torch.float32, DEV, seed=T + G + L)
    assert len(errs) == (5 if L else 3)
    assert max(errs.values()) < 1e-4, errs


@pytest.mark.parametrize("atomic", [False, True])
def test_gradients_bf16_default_tiles(atomic):
    """The variant table's own tiles (128-row dQ blocks, 128-key tiles) on a problem shorter than one."""
    errs = M.check_case(dict(M.VARIANTS["at-kv128x64w8" if atomic else "kv128x64w8-dq128x64w8"]), 1, 19, 8, 1, 64,
                        5, torch.bfloat16, DEV, seed=4)
    assert max(errs.values()) < 2e-2, errs


def test_scale_and_default_tensors():
    """An explicit scale, no depth tensors: dkd, dvd are None."""
    errs = M.check_case(dict(SMALL), 1, 17, 2, 1, 16, 0, torch.float32, DEV, seed=1, scale=0.3)
    assert max(errs.values()) < 1e-4, errs
    q, k, v, _, _, do = M.random_inputs(1, 9, 2, 1, 16, 0, torch.float32, DEV)
    out = M.moda_tma_bwd(q, k, v, q, torch.zeros(1, 9, 2), do, **SMALL)
    assert out[3] is None and out[4] is None and out[0].shape == q.shape and out[1].shape == k.shape


def test_argument_errors():
    q, k, v, kd, vd, do = M.random_inputs(1, 8, 4, 2, 16, 2, torch.float32, DEV)
    lse = torch.zeros(1, 8, 4)
    with pytest.raises(ValueError, match="unknown variant"):
        M.moda_tma_bwd(q, k, v, q, lse, do, kd, vd, blockm=64)
    with pytest.raises(ValueError, match="dq_bm=48"):
        M.moda_tma_bwd(q, k, v, q, lse, do, kd, vd, dq_bm=48)
    with pytest.raises(ValueError, match="kv_bn=8"):
        M.moda_tma_bwd(q, k, v, q, lse, do, kd, vd, kv_bn=8)
    q32, k32 = M.random_inputs(1, 8, 64, 2, 16, 0, torch.float32, DEV)[:2]  # G=32: 16 rows < GP
    with pytest.raises(ValueError, match="multiple of GP=32"):
        M.moda_tma_bwd(q32, k32, k32, q32, torch.zeros(1, 8, 64), q32, dq_bm=16)
    with pytest.raises(ValueError, match="^o must"):
        M.moda_tma_bwd(q, k, v, q[:, :5], lse, do, kd, vd)
    with pytest.raises(ValueError, match="^lse must be a float32"):
        M.moda_tma_bwd(q, k, v, q, lse.double(), do, kd, vd)
    with pytest.raises(ValueError, match="^lse must"):
        M.moda_tma_bwd(q, k, v, q, lse.transpose(1, 2), do, kd, vd)
    with pytest.raises(ValueError):
        M.moda_tma_bwd(q, k[:, :5], v, q, lse, do, kd, vd)  # the package's input checks


def test_variant_table_and_geometry():
    assert len(M.QUICK) == 5 and set(M.QUICK) <= set(M.VARIANTS)
    for name, var in M.VARIANTS.items():
        assert set(var) <= set(M.DEFAULT_VARIANT), name
        assert ("at-" in name) == bool(var.get("atomic")) and name.startswith("p-") == (var.get("use_desc") is False)
    for G in (1, 2, 3, 8, 16):
        for bm in (16, 32, 64, 128):
            gp, P, S, bl = M.depth_geometry(G, bm, 64)
            if bm % gp:
                continue
            assert P * gp == bm and P % S == 0 and (S * gp >= 16 or S == P) and S * bl >= 16 and not bl & (bl - 1)
    assert M.depth_geometry(8, 128, 1)[3] == 8  # L = 1: no wider depth step than the 16 columns needed
    assert M.bwd_flops(1, 16384, 64, 64, 0) == pytest.approx(2.5 * 4 * 64 * 64 * 16384 * 16385 / 2)


def test_rows_append(tmp_path):
    path = str(tmp_path / "bwd_tma.csv")
    M.Rows(path).add(section="check", name="a", ms=1.5)
    M.Rows(path).add(section="time", name="b", note="x")
    lines = open(path).read().splitlines()
    assert lines[0].startswith("section,name,T") and len(lines) == 3 and lines[1].startswith("check,a")


def test_main_without_cuda(capsys):
    if torch.cuda.is_available():
        pytest.skip("the CPU message only")
    T = load_tool("bwd_tma_timing")   # main lives in the timing module (no import cycle)
    assert T.main(["--quick"]) == 0
    assert capsys.readouterr().out.startswith("BWD TMA: not run: no CUDA device")
    assert T.main(["--variants", "nope"]) == 0
    assert "unknown variants ['nope']" in capsys.readouterr().out
