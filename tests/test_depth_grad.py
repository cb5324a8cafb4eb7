"""Detached depth (issue 20): `depth_grad=False` in `moda_attention` and `moda_fa4`.

With depth_grad=False the depth K/V are constants: the backward computes no dk_depth /
dv_depth (DEPTH_GRAD=False compiles their products and stores out of every depth placement),
allocates no buffers for them, and k_depth.grad / v_depth.grad stay None. out, dq, dk, dv must
equal the fp64 reference computed with the depth inputs detached. The same backward runs
automatically when neither depth tensor requires grad.

CPU (Triton interpreter, set by conftest.py): small shapes, few cases (the interpreter is
slow). GPU-marked tests: realistic sizes in bf16 against an fp32 reference, and a timing sanity
check that dropping the depth gradients never makes the backward slower.
"""
import itertools
import statistics

import pytest
import torch
from helpers import TOLERANCE, check_against_reference, random_inputs, rel_err

from moda_bench.kernels.moda import MoDAConfig, moda_attention, moda_reference
from moda_bench.kernels.moda.config import resolve_config
from moda_bench.kernels.moda.fa4.merge import FA4_BACKEND, TORCH_BACKEND, fa4_unavailable, moda_fa4
from moda_bench.kernels.moda.triton import interface as kernel_mod
from moda_bench.kernels.moda.triton.interface import moda_bwd, moda_fwd
from moda_bench.kernels.moda.validate import MoDAShape

FA4_REASON = fa4_unavailable()
needs_fa4 = pytest.mark.skipif(FA4_REASON is not None, reason=f"FA4 unavailable: {FA4_REASON}")

# small tiles, so that several programs of each role run at these T
SMALL = dict(block_m=32, block_n=16, depth_block_m=16, bwd_q_block_m=32, bwd_kv_block_m=16, bwd_kv_block_n=16,
             block_l=16, bwd_block_l=16, bwd_depth_block_m=16)


def _cfg(mode: str, **kw) -> MoDAConfig:
    """Both passes' depth placement; 'stream-after' = side stream, launched after the sequence kernel."""
    after = mode == "stream-after"
    mode = "stream" if after else mode
    return MoDAConfig(fwd_depth=mode, bwd_depth=mode, depth_after=after, bwd_depth_after=after, **kw)


def check_detached(fn, B, T, Hq, Hk, d, L, dtype, seed=0, tol=None, ref_dtype=torch.float64, **kw):
    """fn(q, k, v, kd, vd, depth_grad=False, **kw) fwd + bwd vs the reference with kd, vd
    detached: out, dq, dk, dv within tol; kd.grad, vd.grad None although they require grad.
    Returns the relative errors."""
    tol = tol or TOLERANCE[dtype]
    q, k, v, kd, vd, do = random_inputs(B, T, Hq, Hk, d, L, dtype, seed)
    out = fn(q, k, v, kd, vd, depth_grad=False, **kw)
    assert out.shape == q.shape and out.dtype == q.dtype
    out.backward(do)
    grads = [q.grad, k.grad, v.grad]
    if L:
        assert kd.requires_grad and vd.requires_grad
        assert kd.grad is None and vd.grad is None
    sl = [x.detach().to(ref_dtype).requires_grad_(True) for x in (q, k, v)]
    dep = [None if x is None else x.detach().to(ref_dtype) for x in (kd, vd)]
    ref = moda_reference(*sl, *dep, compute_dtype=ref_dtype, out_dtype=ref_dtype)
    ref_grads = torch.autograd.grad(ref, sl, do.to(ref_dtype))
    errs = {"out": rel_err(out, ref)}
    for n, g, r in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert g is not None and g.shape == r.shape and g.dtype == dtype, n
        errs[n] = rel_err(g, r)
    bad = {k_: e for k_, e in errs.items() if not e < tol}
    assert not bad, f"errors above {tol:g}: {bad} (all: {errs})"
    return errs


def _fa4_torch(*args, **kw):
    return moda_fa4(*args, backend=TORCH_BACKEND, **kw)


# ------------------------------------------------------------------ CPU (interpreter)
# (T, G, L, placement): every T, G, L value and every placement at least once
CASES = [(1, 1, 1, "fused"), (7, 2, 5, "split"), (33, 8, 1, "overlap"), (33, 1, 5, "stream"),
         (7, 8, 0, "fused"), (1, 2, 5, "stream-after"), (7, 1, 1, "overlap"), (33, 2, 5, "fused"),
         (33, 8, 5, "split"), (7, 8, 5, "stream"), (1, 8, 5, "overlap"), (33, 1, 0, "split")]


@pytest.mark.parametrize("T,G,L,mode", CASES, ids=[f"T{t}-G{g}-L{l}-{m}" for t, g, l, m in CASES])
def test_detached_fp32(T, G, L, mode):
    Hk = 2 if G < 8 else 1
    check_detached(moda_attention, 1 + T % 2, T, G * Hk, Hk, 32, L, torch.float32, seed=T * 100 + G * 10 + L,
                   config=_cfg(mode, **SMALL))


def test_detached_bf16():
    check_detached(moda_attention, 1, 33, 8, 2, 64, 5, torch.bfloat16, seed=4, config=_cfg("split", **SMALL))


@pytest.mark.parametrize("mode", ["fused", "split", "overlap", "stream"])
def test_launches_skip_depth_grads(mode):
    """moda_bwd(depth_grad=False), placement by placement: dkd = dvd = None, dq, dk, dv bitwise
    those of depth_grad=True, and nothing written through DKD/DVD (they alias kd, vd then)."""
    B, T, Hq, Hk, d, L = 1, 21, 4, 2, 32, 3
    q, k, v, kd, vd, do = (x.detach() if x is not None else None for x in random_inputs(B, T, Hq, Hk, d, L,
                                                                                          torch.float32, seed=9))
    shape, cfg, scale = MoDAShape(B, T, Hq, Hk, d, L), _cfg(mode, **SMALL), d ** -0.5
    o, lse = moda_fwd(q, k, v, kd, vd, scale, shape, cfg)
    kd0, vd0 = kd.clone(), vd.clone()
    on = moda_bwd(do, q, k, v, kd, vd, o, lse, scale, shape, cfg)
    off = moda_bwd(do, q, k, v, kd, vd, o, lse, scale, shape, cfg, depth_grad=False)
    assert off[3] is None and off[4] is None and on[3] is not None
    for a, b in zip(on[:3], off[:3]):
        assert torch.equal(a, b)
    assert torch.equal(kd, kd0) and torch.equal(vd, vd0)
    if mode == "split":  # the depth-only timing hook (experiments/depth_probe.py, moda_fa4)
        delta = (o * do).sum(-1)  # without it the depth-only launch leaves delta uninitialised
        part_on = moda_bwd(do, q, k, v, kd, vd, o, lse, scale, shape, cfg, depth_only=True, delta=delta)
        part_off = moda_bwd(do, q, k, v, kd, vd, o, lse, scale, shape, cfg, depth_only=True, delta=delta,
                            depth_grad=False)
        assert part_on[3] is not None and part_off[1:] == (None, None, None, None)
        assert torch.equal(part_on[0], part_off[0])


def test_depth_grad_true_unchanged():
    """depth_grad=True (the default) still gives all five gradients."""
    errs = check_against_reference(lambda *a, **kw: moda_attention(*a, return_lse=True, depth_grad=True, **kw),
                                   2, 7, 4, 2, 32, 5, torch.float32, seed=3, config=_cfg("overlap", **SMALL))
    assert {"dk_depth", "dv_depth"} <= set(errs)


def test_no_grad_depth_inputs_take_the_detached_path(monkeypatch):
    """Neither depth tensor requires grad: the backward asks moda_bwd for no depth gradients;
    one of them requiring grad: it asks for them."""
    asked = []

    def spy(*a, **kw):
        asked.append(kw.get("depth_grad", True))
        return moda_bwd(*a, **kw)

    monkeypatch.setattr(kernel_mod, "moda_bwd", spy)
    q, k, v, kd, vd, do = random_inputs(1, 7, 4, 2, 32, 2, torch.float32, seed=1)
    kd, vd = kd.detach(), vd.detach()
    moda_attention(q, k, v, kd, vd, config=_cfg("stream", **SMALL)).backward(do)
    kd.requires_grad_(True)
    moda_attention(q, k, v, kd, vd, config=_cfg("stream", **SMALL)).backward(do)
    assert asked == [False, True]
    assert kd.grad is not None and vd.grad is None


def test_nothing_flows_to_the_depth_producer():
    """Detached means detached: the tensor the depth K/V were computed from gets no gradient."""
    q, k, v, kd, vd, do = random_inputs(1, 7, 4, 2, 32, 2, torch.float32, seed=2)
    src = torch.randn(1, 7, 2, 2, 32, requires_grad=True, device=q.device)
    out = moda_attention(q, k, v, kd + src, vd * src, depth_grad=False, config=_cfg("fused", **SMALL))
    out.backward(do)
    assert src.grad is None and q.grad is not None


@pytest.mark.parametrize("T,G,L,mode", [(1, 8, 1, "split"), (7, 1, 5, "stream"), (33, 2, 0, "split"),
                                        (33, 2, 5, "stream-after")])
def test_fa4_torch_backend_detached(T, G, L, mode):
    check_detached(_fa4_torch, 1, T, G * 2, 2, 32, L, torch.float32, seed=T + G + L, tol=1e-4,
                   config=_cfg(mode, **SMALL))


def test_fa4_torch_backend_true_unchanged_and_no_grad_depth_inputs():
    """depth_grad=True still gives dk_depth, dv_depth (vs fp64); depth inputs that require no
    grad take the detached path with the same out, dq, dk, dv bit for bit."""
    q, k, v, kd, vd, do = random_inputs(1, 9, 4, 2, 32, 3, torch.float32, seed=6)
    cfg = _cfg("split", **SMALL)
    out_on = _fa4_torch(q, k, v, kd, vd, config=cfg, depth_grad=True)
    g_on = torch.autograd.grad(out_on, (q, k, v, kd, vd), do)
    sl = [x.detach().double().requires_grad_(True) for x in (q, k, v, kd, vd)]
    ref_grads = torch.autograd.grad(moda_reference(*sl, out_dtype=torch.float64), sl, do.double())
    assert max(rel_err(a, b) for a, b in zip(g_on, ref_grads)) < 1e-4
    out_off = _fa4_torch(q, k, v, kd.detach(), vd.detach(), config=cfg)
    g_off = torch.autograd.grad(out_off, (q, k, v), do)
    assert torch.equal(out_on, out_off)
    for a, b in zip(g_on[:3], g_off):
        assert torch.equal(a, b)


# ------------------------------------------------------------------ GPU, realistic sizes
GPU_GRID = [(T, G, L, 128 if (G + L + T) % 2 else 64)
            for T, G, L in itertools.product([1000, 2048], [1, 2, 8, 16], [0, 1, 64, 256])]
GPU_IDS = [f"T{t}-G{g}-L{l}-d{d}" for t, g, l, d in GPU_GRID]


def _gpu_check(fn, T, G, L, d, depth_grad, tol):
    kw = dict(seed=T + G + L + d, tol=tol, ref_dtype=torch.float32)
    if depth_grad:
        errs = check_against_reference(lambda *a, **k_: fn(*a, depth_grad=True, **k_), 1, T, 4 * G, 4, d, L,
                                       torch.bfloat16, **kw)
    else:
        errs = check_detached(fn, 1, T, 4 * G, 4, d, L, torch.bfloat16, **kw)
    print(f"T={T} G={G} L={L} d={d} depth_grad={depth_grad}: " + ", ".join(f"{k}={v:.2e}" for k, v in errs.items()))


@pytest.mark.gpu
@pytest.mark.parametrize("depth_grad", [True, False], ids=["grad", "detached"])
@pytest.mark.parametrize("T,G,L,d", GPU_GRID, ids=GPU_IDS)
def test_gpu_moda_attention_bf16(T, G, L, d, depth_grad):
    _gpu_check(moda_attention, T, G, L, d, depth_grad, TOLERANCE[torch.bfloat16])


@pytest.mark.gpu
@needs_fa4
@pytest.mark.parametrize("depth_grad", [True, False], ids=["grad", "detached"])
@pytest.mark.parametrize("T,G,L,d", GPU_GRID, ids=GPU_IDS)
def test_gpu_moda_fa4_bf16(T, G, L, d, depth_grad):
    _gpu_check(moda_fa4, T, G, L, d, depth_grad, 1e-2)


def _bwd_ms(fn, T, G, L, d, rounds=5, **kw):
    """Median over `rounds` interleaved rounds of the backward's median ms, for depth_grad
    False and True (same inputs, graph retained)."""
    from moda_bench.timing import measure
    q, k, v, kd, vd, do = random_inputs(1, T, 8 * G, 8, d, L, torch.bfloat16, seed=0)
    runs = {}
    for dg in (False, True):
        out = fn(q, k, v, kd, vd, depth_grad=dg, **kw)
        ins = (q, k, v, kd, vd) if dg else (q, k, v)
        runs[dg] = lambda out=out, ins=ins: torch.autograd.grad(out, ins, do, retain_graph=True)
        runs[dg]()
    ms = {False: [], True: []}
    for _ in range(rounds):
        for dg in (False, True):
            ms[dg].append(measure(runs[dg], warmup_ms=10, rep_ms=60)["median_ms"])
    return statistics.median(ms[False]), statistics.median(ms[True])


TIMING = [(4096, 8, 64), (2048, 2, 256)]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["fused", "split", "overlap", "stream"])
@pytest.mark.parametrize("T,G,L", TIMING, ids=[f"T{t}-G{g}-L{l}" for t, g, l in TIMING])
def test_gpu_detached_backward_not_slower(T, G, L, mode):
    shape = MoDAShape(1, T, 8 * G, 8, 64, L)
    cfg = resolve_config(shape, torch.bfloat16, None).replace(bwd_depth=mode)
    off, on = _bwd_ms(moda_attention, T, G, L, 64, config=cfg)
    print(f"{mode} T={T} G={G} L={L}: backward detached {off:.3f} ms, with depth grads {on:.3f} ms "
          f"({off / on:.3f}x)")
    assert off <= 1.05 * on, (off, on)


@pytest.mark.gpu
@needs_fa4
@pytest.mark.parametrize("T,G,L", TIMING, ids=[f"T{t}-G{g}-L{l}" for t, g, l in TIMING])
def test_gpu_fa4_detached_backward_not_slower(T, G, L):
    off, on = _bwd_ms(moda_fa4, T, G, L, 64, backend=FA4_BACKEND)
    print(f"fa4 T={T} G={G} L={L}: backward detached {off:.3f} ms, with depth grads {on:.3f} ms "
          f"({off / on:.3f}x)")
    assert off <= 1.05 * on, (off, on)
