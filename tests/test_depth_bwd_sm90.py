"""The depth backward as a CuTe DSL kernel of independent warps (`moda_bench.kernels.moda.cute.bwd_depth_sm90`,
`MoDAConfig.bwd_depth_kernel="cute"`, moda-overlap's default backward where it takes the shape).

CPU: which shapes it takes (`fa4.cute_bwd_shape_problem`, one reason each), the config field,
the heuristic's choice of kernel and program counts, and moda_fa4 with the field set where the
kernel cannot run (the torch sequence backend on the CPU: Triton's depth kernel under the
interpreter, against fp64); where the CuTe DSL imports, the kernel compiles for sm_90a with fake
tensors at odd shapes (no GPU needed).
GPU (`-m gpu`, FA4 on an sm_90 GPU): the depth share of dq and dk_depth, dv_depth against an
fp64 reference at odd T (not a multiple of a warp's positions), G 1/2/4/8/16, L 1/3/5/64/256,
depth_grad on and off (max |err| / max |ref| < 1e-2 in bf16), bitwise equal across program
counts and warps; moda_fa4 with it against the whole problem's reference.
"""
import math

import pytest
import torch
from helpers import check_against_reference, cute_import_problem, cute_sm90_env

from moda_bench.kernels.moda import MoDAConfig, MoDAShape
from moda_bench.kernels.moda.config import check_config
from moda_bench.kernels.moda.fa4.merge import TORCH_BACKEND, cute_bwd_unavailable, fa4_unavailable, moda_fa4
from moda_bench.kernels.moda.reference import depth_backward_reference, moda_reference
from moda_bench.kernels.moda.validate import cute_bwd_shape_problem

FA4_REASON = fa4_unavailable()


def _shape(B=1, T=100, G=8, L=4, d=64, Hk=2):
    return MoDAShape(B=B, T=T, Hq=G * Hk, Hk=Hk, d=d, L=L)


@pytest.mark.parametrize("shape,dtype,needle", [
    (_shape(L=0), torch.bfloat16, "L = 0"),
    (_shape(G=3), torch.bfloat16, "G=3 does not divide 16"),
    (_shape(G=32), torch.bfloat16, "G=32 does not divide 16"),
    (_shape(d=128), torch.bfloat16, "d=128"),
    (_shape(), torch.float32, "fp16/bf16"),
    (_shape(B=2, T=16384, L=256, Hk=8), torch.bfloat16, "32-bit offsets"),
])
def test_shape_problem_names_the_reason(shape, dtype, needle):
    why = cute_bwd_shape_problem(shape, dtype)
    assert why is not None and needle in why and "\n" not in why


def test_shapes_it_takes():
    for G in (1, 2, 4, 8, 16):
        assert cute_bwd_shape_problem(_shape(G=G, L=1), torch.bfloat16) is None
    # exactly 2^31 elements (T=16384, L=256, Hk=8, d=64, B=1): every offset still fits
    assert cute_bwd_shape_problem(_shape(T=16384, L=256, Hk=8), torch.float16) is None


def test_unavailable_without_fa4_says_so():
    if FA4_REASON is None:
        pytest.skip("FA4 installed here")
    assert cute_bwd_unavailable(_shape(), torch.bfloat16) == FA4_REASON


def test_config_field_default_round_trip_and_check():
    assert MoDAConfig().bwd_depth_kernel == "triton"
    cfg = MoDAConfig(bwd_depth="persist", bwd_depth_kernel="cute")
    assert MoDAConfig.from_dict(cfg.to_dict()) == cfg
    check_config(cfg, 8)
    with pytest.raises(ValueError, match="bwd_depth_kernel='tilelang' must be one of"):
        check_config(MoDAConfig(bwd_depth_kernel="tilelang"), 8)


def test_heuristic_picks_the_kernel_and_its_program_counts(monkeypatch):
    from moda_bench.kernels.moda.fa4 import overlap
    monkeypatch.setattr(overlap, "num_sms", lambda device=None: 132)
    monkeypatch.setattr(overlap, "cute_bwd_unavailable", lambda *a, **k: "not here")
    base = overlap.overlap_heuristic(_shape(T=4096, L=64, Hk=8), torch.bfloat16)
    assert (base.bwd_depth_kernel, base.bwd_depth_ctas) == ("triton", 96)
    monkeypatch.setattr(overlap, "cute_bwd_unavailable", lambda *a, **k: None)
    counts = {}
    for T, G, L, dg in ((4096, 8, 64, True), (16384, 8, 64, True), (65536, 8, 64, True), (16384, 2, 64, True),
                        (16384, 8, 256, True), (4096, 8, 64, False)):
        cfg = overlap.overlap_heuristic(_shape(T=T, G=G, L=L, Hk=8), torch.bfloat16, depth_grad=dg)
        assert cfg.bwd_depth_kernel == "cute" and cfg.bwd_depth == "persist"
        assert cfg.depth_ctas == overlap.overlap_programs(_shape(T=T, G=G, L=L, Hk=8), 132, overlap.FWD_SHARE)
        counts[(T, G, L, dg)] = cfg.bwd_depth_ctas
    # 8/132 of the SMs at T=16384, G=8, L=64 scaled by the depth work per FLOP, at least 12
    assert counts == {(4096, 8, 64, True): 32, (16384, 8, 64, True): 12, (65536, 8, 64, True): 12,
                      (16384, 2, 64, True): 32, (16384, 8, 256, True): 32, (4096, 8, 64, False): 20}


def test_field_falls_back_to_triton_where_the_kernel_cannot_run():
    """On the CPU (no sm_90, the torch sequence backend) "cute" runs Triton's depth kernel: the
    same out, lse and gradients as "triton", all against fp64."""
    fn = lambda *a, **k: moda_fa4(*a, return_lse=True, backend=TORCH_BACKEND, **k)  # noqa: E731
    for kernel in ("triton", "cute"):
        cfg = MoDAConfig(fwd_depth="persist", bwd_depth="persist", depth_ctas=2, bwd_depth_ctas=3,
                         bwd_depth_kernel=kernel)
        errs = check_against_reference(fn, 1, 37, 8, 2, 32, 5, torch.float32, seed=11, tol=1e-4, config=cfg)
        assert {"dk_depth", "dv_depth"} <= set(errs)


def test_depth_backward_reference_is_the_depth_part_of_autograd():
    """The fp64 depth-share oracle the GPU tests use: with the whole softmax's out and lse, its
    dk_depth and dv_depth are autograd's of `moda_reference`, and its dq share plus the sequence
    keys' share (the same formula over the causal sequence keys) is autograd's dq."""
    torch.manual_seed(3)
    B, T, G, Hk, L, d = 2, 7, 2, 2, 3, 8
    scale = 1.0 / math.sqrt(d)
    q = torch.randn(B, T, G * Hk, d, dtype=torch.float64, requires_grad=True)
    kd, vd = (torch.randn(B, T, L, Hk, d, dtype=torch.float64, requires_grad=True) for _ in range(2))
    k, v = (torch.randn(B, T, Hk, d, dtype=torch.float64) for _ in range(2))
    do = torch.randn(B, T, G * Hk, d, dtype=torch.float64)
    out, lse = moda_reference(q, k, v, kd, vd, return_lse=True)
    dq, dkd, dvd = torch.autograd.grad(out, (q, kd, vd), do)
    out, lse = out.detach(), lse.double()  # moda_reference returns lse in fp32: agreement to ~1e-7
    dq_d, dkd_r, dvd_r = depth_backward_reference(q.detach(), do, out, lse, kd.detach(), vd.detach(), scale)
    assert torch.allclose(dkd_r, dkd, atol=1e-6) and torch.allclose(dvd_r, dvd, atol=1e-6)
    ks, vs = k.repeat_interleave(G, dim=2), v.repeat_interleave(G, dim=2)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    p = torch.exp((torch.einsum("bthd,bshd->bths", q.detach(), ks) * scale).masked_fill(~causal[:, None], -torch.inf)
                  - lse[..., None])
    ds = p * (torch.einsum("bthd,bshd->bths", do, vs) - (out * do).sum(-1)[..., None])
    dq_s = torch.einsum("bths,bshd->bthd", ds, ks) * scale
    assert torch.allclose(dq_s + dq_d, dq, atol=1e-6)


# ------------------------------------------------------------------ CuTe DSL present: compile only
def _cute_importable():
    return cute_import_problem("flash_attn.cute.ampere_helpers")


COMPILE = [(8, 64, 8, 2, 32, True), (1, 3, 8, 2, 32, True), (2, 256, 8, 2, 32, True), (16, 1, 8, 2, 32, True),
           (4, 5, 8, 2, 32, False), (8, 64, 4, 2, 32, True), (8, 64, 8, 4, 16, True), (16, 16, 8, 3, 16, True)]


@pytest.mark.slow
@pytest.mark.skipif(_cute_importable() is not None, reason=f"CuTe DSL / FA4 not importable: {_cute_importable()}")
@pytest.mark.parametrize("G,L,warps,stages,keys,dg", COMPILE,
                         ids=[f"G{g}-L{l}-w{w}-s{s}-k{k}-dg{int(d)}" for g, l, w, s, k, d in COMPILE])
def test_compiles_for_sm90_with_fake_tensors(monkeypatch, G, L, warps, stages, keys, dg):
    from torch._subclasses.fake_tensor import FakeTensorMode
    cute_sm90_env(monkeypatch)
    from moda_bench.kernels.moda.cute import bwd_depth_sm90 as m
    monkeypatch.setattr(m, "_COMPILED", {})
    with FakeTensorMode():
        B, T, Hk, d = 1, 333, 2, 64
        q = torch.empty(B, T, Hk * G, d, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(B, T, Hk * G, dtype=torch.float32, device="cuda")
        kd = torch.empty(B, T * L, Hk, d, dtype=torch.bfloat16, device="cuda")
        args = (q, q, q, lse, kd, kd, q, kd, kd)
        assert m._compiled(args, 0.125, 4, G, L, warps, stages, dg, keys) is not None
    assert len(m._COMPILED) == 1


@pytest.mark.slow
@pytest.mark.skipif(_cute_importable() is not None, reason=f"CuTe DSL / FA4 not importable: {_cute_importable()}")
def test_compiles_without_held_rows_or_tma_store(monkeypatch):
    """keep_rows=False (q and do re-read from shared memory every step) and tma_store=False (dK / dV
    by vector stores), the A/Bs of experiments/depth_bwd_check.py, still compile, under their own keys."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    cute_sm90_env(monkeypatch)
    from moda_bench.kernels.moda.cute import bwd_depth_sm90 as m
    monkeypatch.setattr(m, "_COMPILED", {})
    with FakeTensorMode():
        q = torch.empty(1, 333, 16, 64, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(1, 333, 16, dtype=torch.float32, device="cuda")
        kd = torch.empty(1, 333 * 64, 2, 64, dtype=torch.bfloat16, device="cuda")
        args = (q, q, q, lse, kd, kd, q, kd, kd)
        for keep, tma in ((True, True), (False, True), (True, False)):
            assert m._compiled(args, 0.125, 4, 8, 64, 8, 2, True, 32, keep, tma) is not None
    assert len(m._COMPILED) == 3


def test_kernel_refuses_more_shared_memory_than_an_sm_has():
    if _cute_importable() is not None:
        pytest.skip("CuTe DSL not importable")
    import cutlass

    from moda_bench.kernels.moda.cute.bwd_depth_sm90 import DepthBwdSm90
    DepthBwdSm90(cutlass.BFloat16, 64, 8, 64, warps=8, stages=2)
    DepthBwdSm90(cutlass.BFloat16, 64, 8, 64, warps=4, stages=4)
    with pytest.raises(ValueError, match="8 warps x 3 stages need ~270 KB of shared memory, more than 227 KB"):
        DepthBwdSm90(cutlass.BFloat16, 64, 8, 64, warps=8, stages=3)
    # 16-key steps: 4 stages fit where a unit has enough steps to keep two q/do slots ...
    assert DepthBwdSm90(cutlass.BFloat16, 64, 8, 64, warps=8, stages=4, step_keys=16).rslots == 2
    # ... and a unit of one step (G=16, L=16) keeps a slot per unit in flight
    assert DepthBwdSm90(cutlass.BFloat16, 64, 16, 16, warps=8, stages=3, step_keys=16).rslots == 3
    with pytest.raises(ValueError, match="8 warps x 4 stages need"):
        DepthBwdSm90(cutlass.BFloat16, 64, 16, 16, warps=8, stages=4, step_keys=16)


# ------------------------------------------------------------------ GPU
def _gpu_reason():
    if not torch.cuda.is_available():
        return "no CUDA"
    return cute_bwd_unavailable(_shape(), torch.bfloat16)


needs_cute = pytest.mark.skipif(_gpu_reason() is not None, reason=f"CuTe depth backward unavailable: {_gpu_reason()}")
GPU_GRID = [(1, 1000, 8, 64), (2, 777, 1, 3), (1, 999, 2, 256), (1, 517, 8, 1), (1, 1001, 16, 64), (2, 333, 4, 5)]


def _depth_inputs(B, T, G, L, Hk=2, d=64, seed=0):
    torch.manual_seed(seed)
    q, do, o = (torch.randn(B, T, G * Hk, d, device="cuda").to(torch.bfloat16) for _ in range(3))
    kd, vd = (torch.randn(B, T, L, Hk, d, device="cuda").to(torch.bfloat16) for _ in range(2))
    scale = 1.0 / math.sqrt(d)
    s = torch.einsum("bthgd,btlhd->bthgl", q.double().view(B, T, Hk, G, d), kd.double()) * scale
    lse = torch.logsumexp(s, -1) + torch.rand(B, T, Hk, G, device="cuda", dtype=torch.float64)  # + the sequence keys
    return q, do, o, lse.reshape(B, T, G * Hk).float().contiguous(), kd, vd, scale


def _rel(a, ref):
    return ((a.double() - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.gpu
@needs_cute
@pytest.mark.parametrize("depth_grad", [True, False], ids=["grad", "detached"])
@pytest.mark.parametrize("B,T,G,L", GPU_GRID, ids=[f"B{b}-T{t}-G{g}-L{l}" for b, t, g, l in GPU_GRID])
def test_gpu_against_fp64(B, T, G, L, depth_grad):
    from moda_bench.kernels.moda.cute.bwd_depth_sm90 import depth_bwd_sm90
    ins = _depth_inputs(B, T, G, L, seed=T + G + L)
    ref = depth_backward_reference(*ins)
    q, do, o, lse, kd, vd, scale = ins
    dq, dkd, dvd = depth_bwd_sm90(do, q, o, lse, kd, vd, scale, G, 7, depth_grad=depth_grad)
    errs = [_rel(dq, ref[0])] + ([_rel(dkd, ref[1]), _rel(dvd, ref[2])] if depth_grad else [])
    assert all(e < 1e-2 for e in errs), errs
    assert depth_grad or (dkd is None and dvd is None)


@pytest.mark.gpu
@needs_cute
def test_gpu_bitwise_across_programs_and_warps():
    """A unit is one warp's from start to end: the program count and warps per program change nothing."""
    from moda_bench.kernels.moda.cute.bwd_depth_sm90 import depth_bwd_sm90
    q, do, o, lse, kd, vd, scale = _depth_inputs(2, 3001, 8, 64, Hk=4, seed=5)
    first = depth_bwd_sm90(do, q, o, lse, kd, vd, scale, 8, 132)
    for n, w in ((1, 8), (13, 8), (24, 4)):
        other = depth_bwd_sm90(do, q, o, lse, kd, vd, scale, 8, n, warps=w)
        assert all(torch.equal(a, b) for a, b in zip(first, other))


@pytest.mark.gpu
@needs_cute
@pytest.mark.parametrize("T,G,L", [(1000, 8, 64), (517, 2, 5), (333, 16, 3)])
def test_gpu_tma_store_equals_vector_stores(T, G, L):
    """A full step's dK / dV rows by TMA and by vector stores are the same bytes (partial steps,
    T's tail and L not a multiple of the step, take the vector stores either way)."""
    from moda_bench.kernels.moda.cute.bwd_depth_sm90 import depth_bwd_sm90
    q, do, o, lse, kd, vd, scale = _depth_inputs(2, T, G, L, Hk=2, seed=T)
    tma = depth_bwd_sm90(do, q, o, lse, kd, vd, scale, G, 11)
    vec = depth_bwd_sm90(do, q, o, lse, kd, vd, scale, G, 11, tma_store=False)
    assert all(torch.equal(a, b) for a, b in zip(tma, vec))


@pytest.mark.gpu
@needs_cute
@pytest.mark.parametrize("T,G,L", [(1999, 8, 64), (1023, 2, 1), (777, 16, 256)])
def test_gpu_moda_fa4_with_it(T, G, L):
    if FA4_REASON is not None:
        pytest.skip(f"FA4 unavailable: {FA4_REASON}")
    cfg = MoDAConfig(fwd_depth="persist", bwd_depth="persist", depth_ctas=16, bwd_depth_ctas=12, side_priority=True,
                     bwd_depth_kernel="cute")
    fn = lambda *a, **k: moda_fa4(*a, return_lse=True, **k)  # noqa: E731
    check_against_reference(fn, 1, T, 4 * G, 4, 64, L, torch.bfloat16, seed=T + L, tol=1e-2,
                            ref_dtype=torch.float32, config=cfg)
