"""MoDA on FlashAttention-4 (moda_bench.kernels.moda.fa4.merge) against the fp64 dense reference.

CPU (Triton interpreter): `moda_fa4` with the plain-torch sequence backend (`TORCH_BACKEND`,
FA4's contract: (o, lse (B,Hq,T)) forward, exact gradients given an external merged (o, lse))
exercises everything of the merge route but FA4 itself: the depth-only Triton launches, the
strided merge kernel, delta, the backward's dq sum. fp32 inputs, ||err|| / ||ref|| < 1e-4 for
out, lse and all five gradients (the interpreter's dots are true fp32).
GPU (`-m gpu`, skipped without CUDA or without flash-attn-4 on an sm90/sm100 GPU): real FA4,
bf16, relative error < 1e-2 against an fp32 reference of the whole problem, plus a prefix check
(fp64) at a long sequence, and `fa4_attention` against SDPA.
"""
import itertools
import math

import pytest
import torch
from helpers import check_against_reference, random_inputs, rel_err

from moda_bench.kernels.moda import MoDAConfig, moda_reference
from moda_bench.kernels.moda.fa4.merge import (
    TORCH_BACKEND,
    SequenceBackend,
    fa4_attention,
    fa4_unavailable,
    fa4_version,
    moda_fa4,
)

HAS_CUDA = torch.cuda.is_available()
FA4_REASON = fa4_unavailable()
needs_fa4 = pytest.mark.skipif(FA4_REASON is not None, reason=f"FA4 unavailable: {FA4_REASON}")

# small depth tiles, so that several depth-only programs run even at T = 37
SMALL = MoDAConfig(depth_block_m=16, bwd_depth_block_m=16, block_l=16, bwd_block_l=16)


def _torch_route(*args, **kw):
    return moda_fa4(*args, return_lse=True, backend=TORCH_BACKEND, **kw)


def _fa4_route(*args, **kw):
    return moda_fa4(*args, return_lse=True, **kw)


GRID = list(itertools.product([37, 70], [1, 2, 4], [0, 1, 5]))


@pytest.mark.parametrize("T,G,L", GRID, ids=[f"T{t}-G{g}-L{l}" for t, g, l in GRID])
def test_merge_route_fp32(T, G, L):
    """Out, lse and all five gradients vs fp64, both placements (in-order / side stream)."""
    B = 2 if (T + G + L) % 2 else 1
    Hk = 2 if G < 4 else 1
    mode = "stream" if (G + L) % 2 else "split"
    cfg = SMALL.replace(fwd_depth=mode, bwd_depth=mode, depth_after=L == 1, bwd_depth_after=L == 5)
    errs = check_against_reference(_torch_route, B, T, G * Hk, Hk, 32, L, torch.float32, seed=T * 100 + G * 10 + L,
                                   tol=1e-4, config=cfg)
    assert set(errs) == {"out", "lse", "dq", "dk", "dv"} | ({"dk_depth", "dv_depth"} if L else set())


def test_merge_route_bf16_d64():
    check_against_reference(_torch_route, 1, 45, 8, 2, 64, 19, torch.bfloat16, seed=5, config=SMALL)


def test_merge_route_default_config_and_scale():
    q, k, v, kd, vd, _ = random_inputs(1, 21, 4, 2, 32, 3, torch.float32, seed=2)
    out = moda_fa4(q, k, v, kd, vd, scale=0.3, backend=TORCH_BACKEND)
    ref = moda_reference(q, k, v, kd, vd, scale=0.3, out_dtype=torch.float64)
    assert rel_err(out, ref) < 1e-5


def test_a_backward_ignoring_the_merged_lse_is_caught():
    """The checks can fail: a sequence backward that normalises with its own (sequence-only)
    lse instead of the merged one gets wrong gradients once there is depth."""

    def own_lse_bwd(q, k, v, o, do, lse, scale):
        _, own = TORCH_BACKEND.fwd(q, k, v, scale)
        return TORCH_BACKEND.bwd(q, k, v, o, do, own, scale)

    bad = SequenceBackend("own-lse", TORCH_BACKEND.fwd, own_lse_bwd, TORCH_BACKEND.dtypes)
    with pytest.raises(AssertionError, match="errors above"):
        check_against_reference(lambda *a, **kw: moda_fa4(*a, backend=bad, **kw), 1, 37, 4, 2, 32, 5, torch.float32,
                                seed=1, tol=1e-4, config=SMALL)
    # ... while without depth the two lse agree and it passes
    check_against_reference(lambda *a, **kw: moda_fa4(*a, backend=bad, **kw), 1, 37, 4, 2, 32, 0, torch.float32,
                            seed=1, tol=1e-4)


# ------------------------------------------------------------------ availability and errors
def test_fa4_unavailable_gives_a_reason_without_raising():
    assert isinstance(fa4_unavailable("cpu"), str)  # never usable on a CPU device
    reason = fa4_unavailable()
    if HAS_CUDA and reason is None:
        pytest.skip("FA4 is usable here")
    assert isinstance(reason, str) and reason and "\n" not in reason


def test_fa4_version():
    from importlib import metadata
    try:
        v = fa4_version()
    except metadata.PackageNotFoundError:
        pytest.skip("flash-attn-4 not installed")
    assert v[0].isdigit() and v != "0.0.0"


def test_fp32_rejected_for_fa4():
    q, k, v, kd, vd, _ = random_inputs(1, 8, 4, 2, 32, 2, torch.float32)
    with pytest.raises(ValueError, match="fa4 sequence backend takes torch.float16, torch.bfloat16"):
        moda_fa4(q, k, v, kd, vd)
    with pytest.raises(ValueError, match="takes torch.float16"):
        fa4_attention(q, k, v)


def test_bad_shapes_still_named():
    q, k, v, kd, vd, _ = random_inputs(1, 8, 4, 2, 32, 2, torch.bfloat16)
    with pytest.raises(ValueError, match="k_depth must have shape"):
        moda_fa4(q, k, v, kd[:, :5], vd[:, :5], backend=TORCH_BACKEND)


@pytest.mark.skipif(HAS_CUDA, reason="CPU tensors")
def test_cpu_tensors_rejected_for_fa4():
    q, k, v, kd, vd, _ = random_inputs(1, 8, 4, 2, 32, 2, torch.bfloat16)
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        moda_fa4(q, k, v, kd, vd)
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        fa4_attention(q, k, v)


# ------------------------------------------------------------------ GPU: real FA4
GPU_GRID = list(itertools.product([1000, 2048], [1, 2, 8], [0, 1, 64]))


@pytest.mark.gpu
@needs_fa4
@pytest.mark.parametrize("T,G,L", GPU_GRID, ids=[f"T{t}-G{g}-L{l}" for t, g, l in GPU_GRID])
def test_gpu_moda_fa4_bf16(T, G, L):
    errs = check_against_reference(_fa4_route, 1, T, 4 * G, 4, 64, L, torch.bfloat16, seed=T + G + L, tol=1e-2,
                                   ref_dtype=torch.float32)
    print(f"T={T} G={G} L={L}: " + ", ".join(f"{k}={v:.2e}" for k, v in errs.items()))


@pytest.mark.gpu
@needs_fa4
@pytest.mark.parametrize("mode,after", [("split", False), ("stream", False), ("stream", True)])
def test_gpu_moda_fa4_placements(mode, after):
    """Depth launches in order or on the side stream (really concurrent on the GPU), B=2, fp16."""
    cfg = MoDAConfig(fwd_depth=mode, bwd_depth=mode, depth_after=after, bwd_depth_after=after)
    check_against_reference(_fa4_route, 2, 2047, 32, 4, 64, 64, torch.float16, seed=3, tol=1e-2,
                            ref_dtype=torch.float32, config=cfg)


@pytest.mark.gpu
@needs_fa4
def test_gpu_moda_fa4_long_prefix():
    """T=8192, G=8, Hk=8, L=64 (the sweeps' shape): output and the five gradients of a 512-position
    prefix vs fp64 (exact for a prefix: positions < n read only keys < n and their own depth
    entries, and do is zero elsewhere)."""
    n = 512
    q, k, v, kd, vd, do = random_inputs(1, 8192, 64, 8, 64, 64, torch.bfloat16, seed=0)
    out = moda_fa4(q, k, v, kd, vd)
    do_prefix = torch.zeros_like(do)
    do_prefix[:, :n] = do[:, :n]
    grads = torch.autograd.grad(out, (q, k, v, kd, vd), do_prefix)
    sl = [x[:, :n].detach().double().requires_grad_(True) for x in (q, k, v, kd, vd)]
    ref = moda_reference(*sl, out_dtype=torch.float64)
    ref_grads = torch.autograd.grad(ref, sl, do[:, :n].double())
    errs = [rel_err(out[:, :n], ref)] + [rel_err(g[:, :n], r) for g, r in zip(grads, ref_grads)]
    assert max(errs) < 1e-2, errs


@pytest.mark.gpu
@needs_fa4
@pytest.mark.parametrize("T,G", [(1000, 1), (2048, 8)])
def test_gpu_fa4_attention_vs_sdpa(T, G):
    q, k, v, _, _, do = random_inputs(1, T, 4 * G, 4, 64, 0, torch.bfloat16, seed=T + G)
    out = fa4_attention(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), do)
    qf, kf, vf = (x.detach().float().requires_grad_(True) for x in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(
        qf.transpose(1, 2), kf.repeat_interleave(G, 2).transpose(1, 2), vf.repeat_interleave(G, 2).transpose(1, 2),
        is_causal=True, scale=1.0 / math.sqrt(64)).transpose(1, 2)
    ref_grads = torch.autograd.grad(ref, (qf, kf, vf), do.float())
    assert out.shape == q.shape and out.dtype == q.dtype
    errs = [rel_err(out, ref)] + [rel_err(a, b) for a, b in zip(grads, ref_grads)]
    assert max(errs) < 1e-2, errs


def test_merge_route_under_the_tma_default(monkeypatch):
    """moda's Hopper default (fwd_depth="tma", block_l per position) given to moda_fa4: correct, and
    its depth-only launch runs with the pointer kernels' own block_l, not the tma one."""
    from moda_bench.kernels.moda.fa4 import merge as fa4_mod
    seen = []
    real = fa4_mod.moda_fwd
    monkeypatch.setattr(fa4_mod, "moda_fwd", lambda *a, **k: seen.append(a[7]) or real(*a, **k))
    cfg = MoDAConfig(fwd_depth="tma", block_m=128, block_n=64, num_warps=8, block_l=32)
    check_against_reference(_torch_route, 1, 37, 8, 1, 32, 70, torch.float32, seed=11, tol=1e-4, config=cfg)
    assert seen and all(c.fwd_depth == "split" and c.block_l == 64 for c in seen)


def test_backward_depth_launch_under_the_tma_default(monkeypatch):
    """moda's "tma" backward default given to moda_fa4 (3 depth stages at T <= 4096, block_l per
    position): correct, and the depth-only backward launch runs with the pointer kernels' own
    stages (2) and block_l (H100: 3 stages took 1.43x the time of 2 at T=4096)."""
    from moda_bench.kernels.moda.fa4 import merge as fa4_mod
    seen = []
    real = fa4_mod.moda_bwd
    monkeypatch.setattr(fa4_mod, "moda_bwd", lambda *a, **k: seen.append(a[10]) or real(*a, **k))
    cfg = MoDAConfig(bwd_depth="tma", bwd_depth_stages=3, bwd_block_l=32)
    check_against_reference(_torch_route, 1, 37, 8, 1, 32, 70, torch.float32, seed=12, tol=1e-4, config=cfg)
    assert seen and all(c.bwd_depth in ("fused", "stream", "split") and c.bwd_depth_stages == 2
                        and c.bwd_block_l == 64 for c in seen)


def test_fa4_unavailable_is_answered_once_per_device(monkeypatch):
    """moda_fa4 asks on every call (forward and, for the CuTe depth backward, backward): the package
    metadata lookup (~0.3 ms) must not be paid each time."""
    from importlib import metadata

    from moda_bench.kernels.moda.fa4 import merge as fa4_mod
    calls = []
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: calls.append(name) or real(name))
    fa4_mod._fa4_unavailable_on.cache_clear()
    try:
        first = [fa4_unavailable() for _ in range(3)]
        assert len(set(first)) == 1 and len(calls) == 1
        assert fa4_unavailable("cpu") is not None and len(calls) == 2  # another device: asked once more
        fa4_unavailable("cpu")
        assert len(calls) == 2
        assert "cannot query the CUDA device" in fa4_unavailable("not-a-device")
    finally:
        fa4_mod._fa4_unavailable_on.cache_clear()
