"""Route B of issue 20: the forward as FA4's sm90 kernel with the depth tiles inside
(`moda_bench.kernels.moda.cute.fwd_sm90`, `MoDAConfig.fa4_fused_fwd`, provider `moda-fused`).

CPU: which shapes it takes (`fa4.fused_fwd_unavailable`, one reason each), the config field, its
refusal on a non-FA4 sequence backend, the provider's registration and skips; where the CuTe DSL
imports (flash-attn-4 installed), the kernel compiles for sm_90a with fake tensors at odd shapes
(no GPU needed: FLASH_ATTENTION_ARCH / CUTE_DSL_ARCH set).
GPU (`-m gpu`, FA4 on an sm_90 GPU): out, lse and all five gradients of moda-overlap with the
fused forward against a float32 reference of the whole problem (relative error < 1e-2, bf16) at
odd T (not a multiple of the 192-row tile or the 128-key block), G 1, 2, 8, 16, L 1, 64, 256,
d 64 and 128, with depth_grad on and off; and its out bitwise equal run to run.
"""

import pytest
import torch
from helpers import check_against_reference, cute_import_problem, cute_sm90_env, random_inputs

from moda_bench.kernels.moda import MoDAConfig, MoDAShape
from moda_bench.kernels.moda.fa4.merge import TORCH_BACKEND, fa4_unavailable, fused_fwd_unavailable, moda_fa4

FA4_REASON = fa4_unavailable()


def _shape(T=100, G=8, L=4, d=64):
    return MoDAShape(B=1, T=T, Hq=2 * G, Hk=2, d=d, L=L)


@pytest.mark.parametrize("shape,dtype,needle", [
    (_shape(L=0), torch.bfloat16, "L = 0"),
    (_shape(G=3), torch.bfloat16, "G=3 does not divide 64"),
    (_shape(G=128), torch.bfloat16, "G=128 does not divide 64"),
    (_shape(d=32), torch.bfloat16, "d=32"),
    (_shape(), torch.float32, "fp16/bf16"),
])
def test_unavailable_names_the_reason(shape, dtype, needle):
    why = fused_fwd_unavailable(shape, dtype)
    assert why is not None and needle in why and "\n" not in why


def test_unavailable_without_fa4_says_so():
    if FA4_REASON is None:
        pytest.skip("FA4 installed here")
    assert fused_fwd_unavailable(_shape(), torch.bfloat16) == FA4_REASON


def test_config_field_default_and_round_trip():
    assert MoDAConfig().fa4_fused_fwd is False
    cfg = MoDAConfig(fa4_fused_fwd=True)
    assert MoDAConfig.from_dict(cfg.to_dict()) == cfg
    assert MoDAConfig.from_dict({k: v for k, v in cfg.to_dict().items() if k != "fa4_fused_fwd"}) == MoDAConfig()


def test_refused_on_the_torch_backend():
    q, k, v, kd, vd, _ = random_inputs(1, 9, 4, 2, 32, 3, torch.float32, seed=1)
    with pytest.raises(ValueError, match="fa4_fused_fwd runs FA4's own kernel; the torch backend"):
        moda_fa4(q, k, v, kd, vd, backend=TORCH_BACKEND, config=MoDAConfig(fa4_fused_fwd=True))


def test_l0_ignores_the_field_on_the_torch_backend():
    """L = 0 is the sequence attention alone, whatever the forward's depth setting."""
    q, k, v, _, _, _ = random_inputs(1, 9, 4, 2, 32, 0, torch.float32, seed=2)
    out = moda_fa4(q, k, v, backend=TORCH_BACKEND, config=MoDAConfig(fa4_fused_fwd=True))
    ref = moda_fa4(q, k, v, backend=TORCH_BACKEND)
    assert torch.equal(out, ref)


def test_provider_registered_and_skips():
    from moda_bench.bench.provider_types import ProviderSkip
    from moda_bench.bench.providers import get_provider
    from moda_bench.bench.runner import Point
    prov = get_provider("moda-fused")
    assert prov.uses_depth and "depth tiles inside" in prov.description
    if FA4_REASON is not None:
        assert prov.unavailable("cuda") == FA4_REASON
    point = Point(B=1, T=64, Hk=2, G=3, d=64, L=4)
    with pytest.raises(ProviderSkip, match="C \\(block_m\\) does not apply"):
        prov.prepare({"q": torch.zeros(1, 64, 6, 64)}, point, 64)
    with pytest.raises(ProviderSkip, match="G=3 does not divide 64"):
        prov.prepare({"q": torch.zeros(1, 64, 6, 64, dtype=torch.bfloat16)}, point, None)


# ------------------------------------------------------------------ CuTe DSL present: compile only
def _cute_importable():
    return cute_import_problem("flash_attn.cute.flash_fwd_sm90")


COMPILE = [(8, 64, 64, "offset"), (8, 64, 64, "first"), (1, 3, 64, "offset"), (16, 1, 64, "offset"),
           (2, 256, 64, "first"), (8, 64, 128, "offset"), (8, 64, 64, "spread"), (1, 3, 64, "spread"),
           (32, 7, 64, "spread"), (4, 32, 64, "spread"), (16, 64, 64, "spread"), (8, 48, 64, "spread"),
           (8, 256, 64, "spread")]


@pytest.mark.slow
@pytest.mark.skipif(_cute_importable() is not None, reason=f"CuTe DSL / FA4 not importable: {_cute_importable()}")
@pytest.mark.parametrize("G,L,d,placement", COMPILE, ids=[f"G{g}-L{l}-d{d}-{p}" for g, l, d, p in COMPILE])
def test_compiles_for_sm90_with_fake_tensors(monkeypatch, G, L, d, placement):
    from torch._subclasses.fake_tensor import FakeTensorMode
    cute_sm90_env(monkeypatch)
    from moda_bench.kernels.moda.cute import fwd_sm90 as fused_sm90
    monkeypatch.setattr(fused_sm90, "_COMPILED", {})
    with FakeTensorMode():
        q = torch.empty(1, 333, 2 * G, d, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(1, 333, 2, d, dtype=torch.bfloat16, device="cuda")
        kd = torch.empty(1, 333, L, 2, d, dtype=torch.bfloat16, device="cuda")
        assert fused_sm90.moda_fused_sm90_compile(q, k, k, kd, kd, placement=placement) is not None
    assert len(fused_sm90._COMPILED) == 1


def test_kernel_refuses_what_it_cannot_tile():
    if _cute_importable() is not None:
        pytest.skip("CuTe DSL not importable")
    import cutlass

    from moda_bench.kernels.moda.cute.fwd_sm90 import MoDAForwardSm90
    with pytest.raises(ValueError, match="G dividing 64"):
        MoDAForwardSm90(cutlass.BFloat16, 64, 3, 4)
    with pytest.raises(ValueError, match="L >= 1"):
        MoDAForwardSm90(cutlass.BFloat16, 64, 8, 0)
    with pytest.raises(ValueError, match="placement"):
        MoDAForwardSm90(cutlass.BFloat16, 64, 8, 4, placement="last")
    with pytest.raises(ValueError, match="d <= 64"):
        MoDAForwardSm90(cutlass.BFloat16, 128, 8, 4, placement="spread")
    with pytest.raises(ValueError, match="depth_tile in"):
        MoDAForwardSm90(cutlass.BFloat16, 64, 8, 4, placement="spread", depth_tile=64)
    with pytest.raises(ValueError, match="probe"):
        MoDAForwardSm90(cutlass.BFloat16, 64, 8, 4, probe="qk1")


def test_paired_warp_steps_where_two_positions_share_a_warp():
    """G=8 puts two positions in a warp's 16 rows: steps of 16 keys of each where L is a multiple of
    16 with the hand-addressed operands; elsewhere (other G, L, d, probes) one position a step."""
    if _cute_importable() is not None:
        pytest.skip("CuTe DSL not importable")
    import cutlass

    from moda_bench.kernels.moda.cute.fwd_sm90 import MoDAForwardSm90

    def kern(G, L, d=64, placement="spread", probe=""):
        return MoDAForwardSm90(cutlass.BFloat16, d, G, L, depth_tile=32 if placement == "spread" else 64,
                               depth_stages=1, placement=placement, probe=probe)
    for G, L in ((8, 64), (8, 256), (8, 48), (8, 16)):
        k = kern(G, L)
        assert k.paired() and k.step_keys() == 16 and k.depth_box() == (16, 2)
        assert k.depth_steps == L // 16  # two positions' L keys, 32 a step
    for G, L, d, placement, probe in ((8, 1, 64, "spread", ""), (8, 40, 64, "spread", ""), (4, 64, 64, "spread", ""),
                                      (16, 64, 64, "spread", ""), (2, 64, 64, "spread", ""),
                                      (8, 64, 64, "offset", ""), (8, 64, 64, "spread", "unpaired"),
                                      (8, 64, 64, "spread", "cuteaddr"), (8, 64, 64, "spread", "cellmask")):
        k = kern(G, L, d, placement, probe)
        assert not k.paired() and k.depth_box() == (k.depth_tile, 1) and k.step_keys() == k.depth_tile


def test_default_placement_tile_and_stages():
    if _cute_importable() is not None:
        pytest.skip("CuTe DSL not importable")
    from moda_bench.kernels.moda.cute import fwd_sm90 as f
    assert all(f.default_placement(T, 64) == "spread" for T in (1000, 4096, 16384, 65536, 131072))
    assert f.default_placement(4096, 128) == "offset" and f.default_placement(65536, 128) == "offset"
    assert (f.default_depth_tile(64, "spread"), f.default_depth_stages("spread")) == (32, 1)
    assert (f.default_depth_tile(64), f.default_depth_tile(128), f.default_depth_stages("offset")) == (64, 32, 2)
    assert f.placement_unavailable("spread", 64) is None and "d <= 64" in f.placement_unavailable("spread", 128)
    assert "placement must be" in f.placement_unavailable("last", 64)


# ------------------------------------------------------------------ GPU
def _gpu_reason():
    if not torch.cuda.is_available():
        return "no CUDA"
    return fused_fwd_unavailable(_shape(), torch.bfloat16)


needs_fused = pytest.mark.skipif(_gpu_reason() is not None, reason=f"fused forward unavailable: {_gpu_reason()}")
GPU_GRID = [(1000, 8, 64, 64), (2047, 1, 1, 64), (777, 2, 256, 64), (1001, 16, 64, 64), (999, 8, 1, 128),
            (517, 2, 64, 128), (1003, 8, 48, 64)]


def _fused(q, k, v, kd, vd, depth_grad=True, **kw):
    from moda_bench.kernels.moda.fa4.overlap import moda_overlap, overlap_config
    shape = MoDAShape(B=q.shape[0], T=q.shape[1], Hq=q.shape[2], Hk=k.shape[2], d=q.shape[3], L=kd.shape[2])
    cfg = overlap_config(shape, q.dtype, q.device, depth_grad).replace(fa4_fused_fwd=True)
    return moda_overlap(q, k, v, kd, vd, config=cfg, depth_grad=depth_grad, return_lse=True, **kw)


@pytest.mark.gpu
@needs_fused
@pytest.mark.parametrize("depth_grad", [True, False], ids=["grad", "detached"])
@pytest.mark.parametrize("T,G,L,d", GPU_GRID, ids=[f"T{t}-G{g}-L{l}-d{d}" for t, g, l, d in GPU_GRID])
def test_gpu_fused_forward_and_gradients(T, G, L, d, depth_grad):
    kw = dict(seed=T + G + L + d, tol=1e-2, ref_dtype=torch.float32)
    if depth_grad:
        errs = check_against_reference(_fused, 1, T, 2 * G, 2, d, L, torch.bfloat16, **kw)
        assert {"out", "lse", "dk_depth", "dv_depth"} <= set(errs)
    else:
        from test_depth_grad import check_detached
        errs = check_detached(lambda *a, **k_: _fused(*a, **k_)[0], 1, T, 2 * G, 2, d, L, torch.bfloat16, **kw)
    print(f"T={T} G={G} L={L} d={d} depth_grad={depth_grad}: " + ", ".join(f"{k}={v:.2e}" for k, v in errs.items()))


@pytest.mark.gpu
@needs_fused
def test_gpu_fused_forward_is_deterministic():
    from moda_bench.kernels.moda.cute.fwd_sm90 import moda_fused_sm90_fwd
    q, k, v, kd, vd, _ = random_inputs(2, 3001, 64, 8, 64, 64, torch.bfloat16, seed=7)
    for placement in ("offset", "first", "spread"):
        a, lse_a = moda_fused_sm90_fwd(q, k, v, kd, vd, placement=placement)
        b, lse_b = moda_fused_sm90_fwd(q, k, v, kd, vd, placement=placement)
        assert torch.equal(a, b) and torch.equal(lse_a, lse_b)
