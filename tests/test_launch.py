"""The host-side launch arithmetic (moda_bench.kernels.launch) agrees with Triton's own helpers, and its
cached launches repeat Triton's (stand-ins on the CPU, MoDA's kernels bitwise on a Hopper GPU)."""
import pytest
import triton
from helpers import cached_against_tritons

from moda_bench.kernels.launch import cdiv, next_pow2


def test_cdiv_and_next_pow2_match_triton():
    for a in (0, 1, 2, 3, 15, 16, 17, 63, 64, 65, 1000, 16384, 10**7 + 3):
        for b in (1, 2, 3, 16, 64, 128):
            assert cdiv(a, b) == triton.cdiv(a, b) == -(-a // b)
        if a >= 1:
            assert next_pow2(a) == triton.next_power_of_2(a)
            assert next_pow2(a) >= a and next_pow2(a) & (next_pow2(a) - 1) == 0
    assert next_pow2(0) == 1 and next_pow2(1) == 1


# ---------------------------------------------------------------- CachedLaunch, with stand-ins
class _Compiled:
    """A stand-in for Triton's compiled kernel: records its launcher's calls."""
    function, packed_metadata = "fn-handle", ("meta",)

    def __init__(self):
        self.calls = []

    def run(self, *a):
        self.calls.append(a)


class _Kernel:
    """A stand-in JIT function of parameters (x, n, BLOCK, FLAG): kernel[grid](*args, **meta)."""
    arg_names = ["x", "n", "BLOCK", "FLAG"]

    def __init__(self):
        self.slow = []
        self.compiled = _Compiled()

    def __getitem__(self, grid):
        def go(*args, **meta):
            self.slow.append((grid, args, meta))
            return self.compiled
        return go


class _Cuda:
    is_cuda = True


def test_cached_launch_repeats_a_key_through_the_launcher(monkeypatch):
    """The first launch of a key goes through the kernel's own path (meta built); later ones call
    the kept kernel's launcher with the grid padded to 3-D, the current stream, no hooks and the
    arguments then the constexprs in signature order (meta not built). Another key, another
    device or key=None take the kernel's path again; CPU tensors always do."""
    from moda_bench.kernels import launch
    monkeypatch.setattr(launch, "_current_stream", lambda: (0, 1234))
    monkeypatch.setattr(launch, "_FAST", True)
    k = _Kernel()
    cl = launch.CachedLaunch(k)
    built = []

    def meta():
        built.append(1)
        return dict(BLOCK=64, FLAG=True, num_warps=4)

    x = _Cuda()
    cl(("a",), (5,), (x, 7), meta)
    assert len(k.slow) == 1 and k.slow[0] == ((5,), (x, 7), dict(BLOCK=64, FLAG=True, num_warps=4))
    assert cl.entries == 1 and not k.compiled.calls
    cl(("a",), (5, 2), (x, 9), meta)
    assert len(k.slow) == 1 and len(built) == 1
    assert k.compiled.calls == [(5, 2, 1, 1234, "fn-handle", ("meta",), None, None, None, x, 9, 64, True)]
    cl(("b",), (5,), (x, 7), meta)       # a new key: Triton's path, then kept
    assert len(k.slow) == 2 and cl.entries == 2
    cl(None, (5,), (x, 7), meta)         # no key: never kept
    assert len(k.slow) == 3 and cl.entries == 2
    monkeypatch.setattr(launch, "_current_stream", lambda: (1, 99))
    cl(("a",), (5,), (x, 7), meta)       # the same key on another device
    assert len(k.slow) == 4 and cl.entries == 3
    cl(("a",), (1, 2, 3), ("cpu tensor", 7), meta)  # not CUDA (the interpreter's tensors)
    assert len(k.slow) == 5 and len(k.compiled.calls) == 1


def test_cached_launch_falls_back_where_it_cannot_repeat(monkeypatch):
    """Triton's own path at every launch: with MODA_BENCH_FAST_LAUNCH off (set_fast_launch), with a
    launch hook installed (a profiler), for a kernel whose result has no launcher (the
    interpreter) and for a parameter left to its default (not in args or meta)."""
    from moda_bench.kernels import launch
    monkeypatch.setattr(launch, "_current_stream", lambda: (0, 1))
    x = _Cuda()
    meta = lambda: dict(BLOCK=64, FLAG=False)  # noqa: E731
    old = launch.set_fast_launch(False)
    try:
        k = _Kernel()
        cl = launch.CachedLaunch(k)
        for _ in range(3):
            cl(("a",), (1,), (x, 1), meta)
        assert len(k.slow) == 3 and cl.entries == 0 and not launch.fast_launch()
    finally:
        launch.set_fast_launch(old)
    monkeypatch.setattr(launch, "_FAST", True)
    k = _Kernel()
    cl = launch.CachedLaunch(k)
    cl(("a",), (1,), (x, 1), meta)
    monkeypatch.setattr(launch, "_hooks_idle", lambda: False)
    cl(("a",), (1,), (x, 1), meta)
    assert len(k.slow) == 2 and not k.compiled.calls
    k = _Kernel()
    k.compiled = object()               # no run / function / packed_metadata
    cl = launch.CachedLaunch(k)
    cl(("a",), (1,), (x, 1), meta)
    assert cl.entries == 0
    k = _Kernel()
    cl = launch.CachedLaunch(k)
    cl(("a",), (1,), (x, 1), lambda: dict(BLOCK=64))  # FLAG left to a default
    assert cl.entries == 0


def test_hooks_idle_reads_tritons_hook_chains(monkeypatch):
    """No hook installed here; one installed (as a profiler does) is seen, in either form Triton
    keeps its hooks (a chain of callables, or a callable or None)."""
    from moda_bench.kernels import launch

    class Chain:
        def __init__(self, calls):
            self.calls = calls

    class Rt:
        launch_enter_hook, launch_exit_hook = Chain([]), None

    monkeypatch.setattr(launch, "_RUNTIME", [Rt])
    assert launch._hooks_idle()
    Rt.launch_exit_hook = Chain([print])
    assert not launch._hooks_idle()
    Rt.launch_exit_hook = print
    assert not launch._hooks_idle()


def _cached_against_tritons(monkeypatch, ins, do, cfg):
    """One MoDA fwd+bwd (inputs `ins`, gradient `do`, config `cfg`) through Triton's own launch
    path, then twice with the cache on: (launches the second cached call took from the cache,
    whether its out and gradients are bitwise the first's; `helpers.cached_against_tritons`)."""
    from moda_bench.kernels.moda import moda_attention

    def step():
        for x in ins:
            x.grad = None
        out = moda_attention(*ins, config=cfg)
        out.backward(do)
        return [out] + [x.grad for x in ins]
    return cached_against_tritons(monkeypatch, step)


def _gpu_inputs(T, G, L):
    import torch
    from helpers import random_inputs
    ins = list(random_inputs(1, T, 4 * G, 4, 64, L, torch.bfloat16, seed=T))
    do = ins.pop()
    return [x for x in ins if x is not None], do


@pytest.mark.gpu
def test_gpu_cached_launches_give_tritons_results(monkeypatch):
    """On a Hopper GPU, MoDA's descriptor launches (forward, dq pass, key-major pass, or both passes in one) repeat
    from the cache after their first call, and out and all five gradients are bitwise those of
    Triton's own path, at odd T, G in {1, 2, 8} and L in {0, 5, 64}."""
    import torch

    from moda_bench.kernels.moda.config import resolve_config
    from moda_bench.kernels.moda.validate import MoDAShape
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs a Hopper GPU (device-side descriptors)")
    for T, G, L in ((1000, 8, 64), (333, 2, 0), (77, 1, 5)):
        cfg = resolve_config(MoDAShape(B=1, T=T, Hq=4 * G, Hk=4, d=64, L=L), torch.bfloat16).replace(
            fwd_depth="tma", bwd_depth="tma")
        cached, same = _cached_against_tritons(monkeypatch, *_gpu_inputs(T, G, L), cfg)
        # forward, dq pass, key-major pass, all from the cache; at L > 0 (T <= 1024, eager) both
        # passes in one launch (`kernel_bwd_rules.kv_one`)
        assert cached == (2 if L else 3), (T, G, L)
        assert same, (T, G, L)


@pytest.mark.gpu
@pytest.mark.parametrize("place,launches", [("fused", 3), ("split", 6), ("stream", 7), ("overlap", 5)])
def test_gpu_cached_pointer_launches_give_tritons_results(monkeypatch, place, launches):
    """The pointer kernels' launches (forward, q-major and key-major passes, depth-only launches,
    and the merge of "stream" and "overlap" and the delta kernel of every placement but "fused",
    whose q-major pass computes delta) repeat from the cache after their first call, with out and
    all five gradients bitwise those of Triton's own path, in every placement (L=64, odd T) and at
    L = 0 (T=77, G=2)."""
    import torch

    from moda_bench.kernels.moda import MoDAConfig
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    for T, G, L, n in ((333, 8, 64, launches), (77, 2, 0, 3)):
        cached, same = _cached_against_tritons(monkeypatch, *_gpu_inputs(T, G, L),
                                               MoDAConfig(fwd_depth=place, bwd_depth=place))
        assert cached == n, (place, T, G, L, cached)
        assert same, (place, T, G, L)


@pytest.mark.gpu
def test_gpu_cached_depth_and_merge_launches_give_tritons_results(monkeypatch):
    """The streaming depth kernels (`kernel_depth.depth_fwd`, `depth_bwd`, with and without
    depth_grad) and moda-fa4's merge (`fa4._merge`) repeat from the cache after their first call,
    bitwise Triton's own path (odd T, G=8, L=64; no FA4 needed)."""
    import torch
    from helpers import cached_against_tritons, random_inputs

    from moda_bench.kernels.moda.fa4 import merge as fa4
    from moda_bench.kernels.moda.triton import depth as kernel_depth
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    q, k, v, kd, vd, do = random_inputs(1, 333, 32, 4, 64, 64, torch.bfloat16, seed=5)
    scale = 0.125
    od, lsed = kernel_depth.depth_fwd(q, kd, vd, scale, 8, 16)
    o = (q + od).contiguous()
    lse_ht = lsed.transpose(1, 2).contiguous() + 0.5
    steps = {
        "depth_fwd": (lambda: kernel_depth.depth_fwd(q, kd, vd, scale, 8, 16), 1),
        "depth_bwd": (lambda: kernel_depth.depth_bwd(do, q, o, lsed, kd, vd, scale, 8, 16), 1),
        "depth_bwd detached": (lambda: kernel_depth.depth_bwd(do, q, o, lsed, kd, vd, scale, 8, 16,
                                                              depth_grad=False)[:1], 1),
        "fa4 merge": (lambda: fa4._merge(o, lse_ht, od, lsed), 1),
    }
    for name, (step, n) in steps.items():
        cached, same = cached_against_tritons(monkeypatch, step)
        assert cached == n and same, (name, cached, same)


def test_tma_alignment_rule_and_sm_count():
    """`aligned`: base address and every stride but the last a 16-byte multiple; a contiguous
    tensor's strides read from its shape (torch's arbitrary stride on a length-1 dimension does
    not count), a strided view's from its strides. `num_sms` is 4 off CUDA, asked once a device."""
    import torch

    from moda_bench.kernels.moda.triton import fwd_tma as ft
    x = torch.zeros(2, 5, 3, 8, dtype=torch.bfloat16)          # rows of 16 bytes
    assert ft.aligned(x, None)
    assert not ft.aligned(torch.zeros(2, 5, 3, 4, dtype=torch.bfloat16))   # rows of 8 bytes
    assert not ft.aligned(x.view(-1)[1:].view(1, 239))          # base 2 bytes off
    odd = torch.zeros(1, 4, 8, dtype=torch.bfloat16).as_strided((1, 4, 8), (3, 8, 1))
    assert odd.is_contiguous() and ft.aligned(odd)              # length-1 dimension's stride ignored
    cols = torch.zeros(4, 12, dtype=torch.bfloat16)[:, :8]      # strided view: its row stride counts
    assert not cols.is_contiguous() and not ft.aligned(cols)
    assert ft.aligned(torch.zeros(4, 16, dtype=torch.bfloat16)[:, :8])
    assert ft.num_sms(None) == 4 and ft.num_sms(torch.device("cpu")) == 4


@pytest.mark.gpu
def test_gpu_cached_decode_launches_give_tritons_results(monkeypatch):
    """Decode's split and combine launches repeat from the cache after their first call and give
    bitwise Triton's own path: dense cache with auto splits (split + combine, PDL where the GPU
    has it), one split (direct), the fused combine, descriptor (TMA) tiles, a paged cache, L = 0."""
    from dataclasses import replace

    import torch

    from moda_bench.kernels import launch
    from moda_bench.kernels.decode import DecodeConfig, moda_decode
    from moda_bench.kernels.decode import interface as kmod
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from test_decode import make_inputs
    hits = []
    idle = launch._hooks_idle
    monkeypatch.setattr(launch, "_hooks_idle", lambda: hits.append(1) or idle())
    dense = make_inputs(2, 1, 64, 8, 64, 64, 4099, torch.bfloat16, seed=3, lens=[4099, 3001])
    base = kmod.default_config(dense["q"].device, 16)
    cases = [(dense, None, base, 2), (dense, 1, base, 1), (dense, 5, replace(base, pdl=False, fused_combine=True), 1),
             (dense, 5, replace(base, pdl=False, tma=True), 2),
             (make_inputs(2, 2, 16, 2, 64, 0, 999, torch.bfloat16, seed=4, lens=[999, 500], page_size=16), 3,
              DecodeConfig(), 2)]
    for i, (kw, S, cfg, n) in enumerate(cases):
        kw = {k: v for k, v in kw.items() if k != "dense"}
        old = launch.set_fast_launch(False)
        try:
            ref = moda_decode(**kw, num_splits=S, config=cfg)
        finally:
            launch.set_fast_launch(old)
        monkeypatch.setattr(launch, "_FAST", True)
        moda_decode(**kw, num_splits=S, config=cfg)
        before = len(hits)
        got = moda_decode(**kw, num_splits=S, config=cfg)
        assert len(hits) - before == n, i
        assert torch.equal(got, ref), i


def test_aligned16():
    """`aligned16`: every data pointer 16-byte aligned (the condition for a `CachedLaunch` key)."""
    import torch

    from moda_bench.kernels.launch import aligned16
    x = torch.zeros(64, dtype=torch.float32)
    assert aligned16(x) and aligned16(x, x[4:]) and aligned16()
    assert not aligned16(x, x[1:]) and not aligned16(x[2:])
