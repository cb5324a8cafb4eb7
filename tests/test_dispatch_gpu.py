"""GPU correctness of every MoDA route behind the dispatcher (issue 60, item 4): `moda_attention(impl=...)`
for each of "triton", "fa4", "overlap" and "fused" against the fp64 reference, with a check of which
route actually ran (a route that silently fell back to Triton would pass the numbers).

What runs where:
* GPU (`-m gpu`): `test_gpu_route_against_fp64`: every route at every `CASES` shape: out (and lse) and
  all five gradients (q, k, v, k_depth, v_depth) with depth gradients on, out and dq, dk, dv with them
  off (k_depth, v_depth then get no gradient), relative error ||err|| / ||ref|| below
  `helpers.TOLERANCE` (bf16 2e-2, fp16 5e-3). `test_gpu_auto_is_its_choice`: impl "auto" runs the
  route `dispatch.choose` names and gives that route's result bit for bit (out and lse; the gradients
  too on the Triton route; on the FA4 routes the depth gradients bit for bit and dq, dk, dv within
  `REORDER_TOL`, since FA4's backward sums dq (and GQA's dk, dv) with fp32 atomics in no fixed order).
  `test_gpu_strided_depth`: depth K/V as slices of (B, T, E, Hk, d) buffers, as the model passes
  them, through each route: right against the fp64 reference, the buffers' gradients only in the
  slice, and the contiguous call's result (bit for bit where the route copies the slice: out, lse and
  the depth gradients of the FA4 routes; within `REORDER_TOL` else: the Triton descriptor forward
  takes contiguous depth only, so a slice runs the pointer kernel, fp32 rounding apart).
  `test_gpu_route_falls_back_or_runs`: at d=32 (the Triton kernel's, not FA4's) each impl runs its
  route or, where `dispatch.unavailable` says why not, Triton's, right either way (never an error).
* Route check (`routes` fixture): spies on `dispatch.run`, the Triton kernel's forward and backward
  (`triton.interface._forward`, `_gradients`), the FA4 routes' forward and backward
  (`fa4.merge._forward`, `_backward`: their config's placement and sequence backend) and the fused
  forward kernel (`merge._fused_forward`); `ran` names what ran, `EXPECTED` what each impl must run.
  Where a route cannot run a shape on this machine (`dispatch.unavailable`) the test skips with the
  reason (no flash-attn-4: every non-Triton test skips with that one reason); otherwise
  `dispatch.choose` must name the asked route and the spies must see it.
* CPU (no GPU needed): `CASES` covers every value of every axis issue 60 lists (and the pairs that
  stress a route), the fp64 reference fits the GPU's memory, and the spies tell a silent fallback and
  the FA4 routes apart (the FA4 routes on the torch sequence backend under the interpreter).

Budget (H100, estimate): the kernels' own time is negligible (the largest call, T=4099 with 16 query
heads, is about a millisecond), and so is the fp64 reference's (at most ~0.5 TFLOP of fp64 GEMM and
~40 GB of elementwise traffic over all cases, under a second; its largest score matrix 2.2 GB);
compiling dominates: Triton specialisations (~1-2 s each), FA4's forward and backward per dtype, head
dim and G, the fused forward per (dtype, d, G, L) and the CuTe depth backward per (dtype, G, L,
depth_grad) (~5-15 s each). 8 cases x 4 routes + 4 strided + 4 auto + 4 d=32 calls: about 20 s
Triton, 40 s fa4, 40 s overlap, 60-80 s fused, 30 s strided, auto and d=32: 3 minutes, 3.5 at worst.
The strided and auto shapes reuse the T=4099, G=8, L=64 case's compile keys (dtype, d, G, L).
"""
from __future__ import annotations

import inspect
from typing import NamedTuple

import pytest
import torch
from helpers import TOLERANCE, check_against_reference, random_inputs, rel_err
from test_depth_grad import check_detached

from moda_bench.kernels.moda import dispatch, moda_attention, moda_reference
from moda_bench.kernels.moda.fa4 import merge
from moda_bench.kernels.moda.triton import interface
from moda_bench.kernels.moda.validate import MoDAShape

FA4_REASON = merge.fa4_unavailable()
BF16, FP16 = torch.bfloat16, torch.float16
# two results of the same math summed in another order (FA4's fp32 atomic dq and GQA dk, dv; the Triton
# pointer kernel beside its descriptor kernel) differ by a bf16 ulp on a few elements, far below this; a
# wrong route or stride errs by O(1)
REORDER_TOL = 1e-3

# the axes of issue 60, item 4 (T: not a multiple of any tile, 16 to 192 rows or keys, plus T = 1)
ISSUE_60 = {"G": {1, 2, 4, 8, 16, 32}, "L": {1, 7, 64, 256}, "d": {64, 128}}
ISSUE_60_T = {1, 67, 1000, 4099}


class Case(NamedTuple):
    """One shape of the route tests: B, T, G (query heads per KV head), Hk, L, d, dtype, depth_grad."""

    B: int
    T: int
    G: int
    Hk: int
    L: int
    d: int
    dtype: torch.dtype
    depth_grad: bool

    @property
    def shape(self) -> MoDAShape:
        return MoDAShape(B=self.B, T=self.T, Hq=self.G * self.Hk, Hk=self.Hk, d=self.d, L=self.L)

    @property
    def id(self) -> str:
        dt = "bf16" if self.dtype == BF16 else "fp16"
        return (f"B{self.B}-T{self.T}-G{self.G}-Hk{self.Hk}-L{self.L}-d{self.d}-{dt}-"
                + ("grad" if self.depth_grad else "detached"))


# a covering set, not the cross product: every value of every axis, both dtypes and both depth_grad
# values (each with both head dims), and the pairs that stress a route
CASES = [
    Case(2, 1, 32, 1, 64, 64, BF16, True),       # T=1: one sequence key beside 64 depth keys; G=32; B=2
    Case(1, 67, 1, 4, 256, 64, BF16, False),     # L=256 at small T (depth dominates), G=1, detached
    Case(1, 67, 32, 2, 7, 128, BF16, True),      # G=32 with d=128 (64 query heads)
    Case(1, 1000, 2, 2, 256, 128, FP16, True),   # L=256 with d=128, fp16
    Case(1, 1000, 16, 2, 1, 64, BF16, False),    # G=16, L=1, detached
    Case(1, 4099, 8, 2, 64, 64, BF16, True),     # the paper's G and L past a tile boundary
    Case(1, 4099, 2, 2, 7, 128, FP16, False),    # long T, d=128, fp16, detached
    Case(2, 1, 4, 2, 7, 64, BF16, False),        # T=1, G=4, B=2, detached
]
# what each impl must run: (forward, backward) as `ran` names them
EXPECTED = {"triton": ("triton", "triton"), "fa4": ("fa4", "fa4"), "overlap": ("overlap", "persist"),
            "fused": ("fused", "persist")}


# ------------------------------------------------------------------ which route ran
def _spy(monkeypatch, seen: list, mod, name: str, tag) -> None:
    """Replace mod.name by a wrapper that appends tag(its bound arguments) to `seen` and calls it."""
    real = getattr(mod, name)
    sig = inspect.signature(real)

    def wrapper(*args, **kwargs):
        seen.append(tag(sig.bind(*args, **kwargs).arguments))
        return real(*args, **kwargs)

    monkeypatch.setattr(mod, name, wrapper)


def _fa4_forward(a) -> tuple:
    cfg = a["cfg"]
    route = "fused" if cfg.fa4_fused_fwd else "overlap" if cfg.fwd_depth == "persist" else "fa4"
    return ("fwd", route, a["backend"].name)


def _fa4_backward(a) -> tuple:
    return ("bwd", "persist" if a["cfg"].bwd_depth == "persist" else "fa4", a["backend"].name)


@pytest.fixture
def routes(monkeypatch) -> list:
    """The list of what ran since the test began: ("run", impl) for each `dispatch.run`, ("fwd" |
    "bwd", route, sequence backend) for each forward and backward, ("kernel", "fused") for each fused
    forward kernel call."""
    seen: list = []
    _spy(monkeypatch, seen, dispatch, "run", lambda a: ("run", a["choice"].impl))
    _spy(monkeypatch, seen, interface, "_forward", lambda a: ("fwd", "triton", "triton"))
    _spy(monkeypatch, seen, interface, "_gradients", lambda a: ("bwd", "triton", "triton"))
    _spy(monkeypatch, seen, merge, "_forward", _fa4_forward)
    _spy(monkeypatch, seen, merge, "_backward", _fa4_backward)
    _spy(monkeypatch, seen, merge, "_fused_forward", lambda a: ("kernel", "fused"))
    return seen


def ran(seen: list) -> tuple:
    """(forward route, backward route) of the calls in `seen`; ValueError when the calls ran more than
    one route in a pass, none, or an FA4 route on a sequence backend other than FA4's."""
    out = []
    for kind in ("fwd", "bwd"):
        got = {(r, b) for k, r, *rest in seen if k == kind for b in rest}
        if len(got) != 1:
            raise ValueError(f"{kind}: {len(got)} routes ran ({sorted(got)}; all calls {seen})")
        (route, backend), = got
        if route != "triton" and backend != "fa4":
            raise ValueError(f"{kind}: route {route} ran on the {backend} sequence backend, not FA4's")
        out.append(route)
    return tuple(out)


def assert_ran(seen: list, impl: str) -> None:
    """The calls in `seen` ran `impl`'s route in both passes, dispatched to it (and, for "fused", through
    the fused forward kernel)."""
    assert ran(seen) == EXPECTED[impl], f"asked for {impl}, ran {ran(seen)} (calls {seen})"
    dispatched = {r for k, r, *_ in seen if k == "run"}
    assert dispatched == (set() if impl == "triton" else {impl}), seen
    assert (("kernel", "fused") in seen) == (impl == "fused"), seen


def skip_unless_runs(impl: str, shape: MoDAShape, dtype, depth_grad: bool = True) -> None:
    """Skip (with the reason) where `impl` cannot run this shape here; else check the dispatcher asks
    for it."""
    if impl != "triton" and FA4_REASON is not None:
        pytest.skip(f"flash-attn-4 unavailable: {FA4_REASON}")
    device = torch.device("cuda", torch.cuda.current_device())
    why = dispatch.unavailable(impl, shape, dtype, device)
    if why is not None:
        pytest.skip(f"{impl} cannot run {shape} here: {why}")
    choice = dispatch.choose(shape, dtype, device, depth_grad=depth_grad, impl=impl)
    assert choice.impl == impl, choice.detail()


def _call(impl: str):
    def fn(q, k, v, kd, vd, **kw):
        return moda_attention(q, k, v, kd, vd, impl=impl, **kw)
    return fn


def _errs(errs: dict) -> str:
    return ", ".join(f"{k}={v:.2e}" for k, v in errs.items())


# ------------------------------------------------------------------ GPU: each route against fp64
@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
@pytest.mark.parametrize("impl", dispatch.IMPLS)
def test_gpu_route_against_fp64(routes, impl, case):
    skip_unless_runs(impl, case.shape, case.dtype, case.depth_grad)
    s, seed = case.shape, case.T + 10 * case.G + case.L + case.d
    if case.depth_grad:
        errs = check_against_reference(_call(impl), s.B, s.T, s.Hq, s.Hk, s.d, s.L, case.dtype, seed=seed,
                                       return_lse=True, depth_grad=True)
        assert {"out", "lse", "dk_depth", "dv_depth"} <= set(errs)
    else:
        errs = check_detached(_call(impl), s.B, s.T, s.Hq, s.Hk, s.d, s.L, case.dtype, seed=seed)
    assert_ran(routes, impl)
    print(f"{impl} {case.id}: {_errs(errs)}")


# ------------------------------------------------------------------ GPU: "auto" is its choice
# (B, T, G, Hk, L, d), bf16, training with depth gradients: near the shipped rules' points that pick
# fused / overlap (T=4096 / 8192, G=8, L=64), fa4 (T=8192, G=4, small L) and triton (far from all)
AUTO = [(1, 4099, 8, 2, 64, 64), (1, 8191, 8, 2, 64, 64), (1, 8191, 4, 4, 7, 64), (1, 1000, 16, 2, 1, 64)]


def _fwd_bwd(inputs, do, **kw):
    """(out, lse, [the five gradients]) of one moda_attention fwd+bwd on fresh leaf copies."""
    ins = [x.detach().clone().requires_grad_(True) for x in inputs]
    out, lse = moda_attention(*ins, return_lse=True, **kw)
    out.backward(do)
    return out, lse, [x.grad for x in ins]


def _same_grads(impl: str, got: list, want: list, names=("dq", "dk", "dv", "dk_depth", "dv_depth")) -> None:
    """Bit for bit on the Triton route and for the FA4 routes' depth gradients; dq, dk, dv of an FA4
    route within REORDER_TOL (module docstring)."""
    for name, a, b in zip(names, got, want):
        assert (a is None) == (b is None), name
        if a is None:
            continue
        if impl == "triton" or name.startswith("dk_") or name.startswith("dv_"):
            assert torch.equal(a, b), f"{name}: {rel_err(a, b):.2e}"
        else:
            assert rel_err(a, b) < REORDER_TOL, f"{name}: {rel_err(a, b):.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("B,T,G,Hk,L,d", AUTO, ids=[f"T{t}-G{g}-Hk{h}-L{l}" for _, t, g, h, l, _ in AUTO])
def test_gpu_auto_is_its_choice(routes, B, T, G, Hk, L, d):
    shape = MoDAShape(B=B, T=T, Hq=G * Hk, Hk=Hk, d=d, L=L)
    device = torch.device("cuda", torch.cuda.current_device())
    choice = dispatch.choose(shape, BF16, device, depth_grad=True, training=True)
    print(f"T={T} G={G} Hk={Hk} L={L}: {choice.detail()}")
    *inputs, do = random_inputs(B, T, G * Hk, Hk, d, L, BF16, seed=T + G + L)
    auto = _fwd_bwd(inputs, do, impl="auto")
    assert_ran(routes, choice.impl)
    routes.clear()
    asked = _fwd_bwd(inputs, do, impl=choice.impl)
    assert_ran(routes, choice.impl)
    assert torch.equal(auto[0], asked[0]) and torch.equal(auto[1], asked[1])
    _same_grads(choice.impl, auto[2], asked[2])


# ------------------------------------------------------------------ GPU: strided depth K/V
STRIDED = Case(2, 1000, 8, 2, 64, 64, BF16, True)   # the T=4099 case's compile keys at another T and B
E_BUF, FIRST = 66, 1                                 # slices [FIRST, FIRST + L) of (B, T, E_BUF, Hk, d) buffers


@pytest.mark.gpu
@pytest.mark.parametrize("impl", dispatch.IMPLS)
def test_gpu_strided_depth(routes, impl):
    c, s = STRIDED, STRIDED.shape
    skip_unless_runs(impl, s, c.dtype)
    q, k, v, _, _, do = random_inputs(s.B, s.T, s.Hq, s.Hk, s.d, 0, c.dtype, seed=11)
    gen = torch.Generator().manual_seed(12)
    bufs = [torch.randn(s.B, s.T, E_BUF, s.Hk, s.d, generator=gen).to(q.device, c.dtype).requires_grad_(True)
            for _ in range(2)]
    kd, vd = (b[:, :, FIRST:FIRST + s.L] for b in bufs)
    assert not kd.is_contiguous() and kd.data_ptr() != bufs[0].data_ptr()
    ins = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    out, lse = moda_attention(*ins, kd, vd, impl=impl, return_lse=True)
    out.backward(do)
    assert_ran(routes, impl)
    got = [x.grad for x in ins] + [b.grad[:, :, FIRST:FIRST + s.L] for b in bufs]
    for b in bufs:  # the gradient lands in the slice only
        rest = torch.cat([b.grad[:, :, :FIRST], b.grad[:, :, FIRST + s.L:]], dim=2)
        assert not rest.any()
    # right: against the fp64 reference
    leaves = [x.detach().double().requires_grad_(True) for x in (q, k, v, kd, vd)]
    ref, ref_lse = moda_reference(*leaves, return_lse=True, out_dtype=torch.float64)
    ref_grads = torch.autograd.grad(ref, leaves, do.double())
    errs = {"out": rel_err(out, ref), "lse": rel_err(lse, ref_lse)}
    errs.update({n: rel_err(a, b) for n, a, b in zip(("dq", "dk", "dv", "dk_depth", "dv_depth"), got, ref_grads)})
    assert max(errs.values()) < TOLERANCE[c.dtype], errs
    # the same: the contiguous call
    want = _fwd_bwd([q, k, v, kd.detach().contiguous(), vd.detach().contiguous()], do, impl=impl)
    if impl == "triton":
        assert rel_err(out, want[0]) < REORDER_TOL and rel_err(lse, want[1]) < REORDER_TOL
        for name, a, b in zip(("dq", "dk", "dv", "dk_depth", "dv_depth"), got, want[2]):
            assert rel_err(a, b) < REORDER_TOL, name
    else:
        assert torch.equal(out, want[0]) and torch.equal(lse, want[1])
        _same_grads(impl, got, want[2])
    print(f"{impl} strided: {_errs(errs)}")


# ------------------------------------------------------------------ GPU: a shape a route may refuse
# a head dim the Triton kernel takes and FA4's kernels may not (sm90: 64, 96, 128): the dispatcher's
# contract is that such a call falls back to "triton" (dispatch.unavailable says why), never an error
ODD_D = Case(1, 67, 2, 2, 7, 32, BF16, True)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", dispatch.IMPLS)
def test_gpu_route_falls_back_or_runs(routes, impl):
    """At d=32 each impl either runs its route or, where `dispatch.unavailable` names a reason, Triton's,
    right against fp64 either way. A failure inside FA4 here is a shape `dispatch.shape_problem` misses."""
    s = ODD_D.shape
    device = torch.device("cuda", torch.cuda.current_device())
    why = dispatch.unavailable(impl, s, ODD_D.dtype, device)
    errs = check_against_reference(_call(impl), s.B, s.T, s.Hq, s.Hk, s.d, s.L, ODD_D.dtype, seed=5,
                                   return_lse=True, depth_grad=True)
    assert_ran(routes, impl if why is None else "triton")
    print(f"{impl} d=32 ({why or 'runs'}): {_errs(errs)}")


# ------------------------------------------------------------------ CPU: the claims above hold
def test_cases_cover_issue_60():
    """Every value of every axis issue 60 lists, both dtypes and depth_grad values, and the pairs that
    stress a route; no T a multiple of a tile; the fp64 reference's score matrices fit (<= 3 GiB each)."""
    for axis, values in ISSUE_60.items():
        assert values <= {getattr(c, axis) for c in CASES}, axis
    assert ISSUE_60_T <= {c.T for c in CASES}
    assert all(c.T == 1 or c.T % 16 for c in CASES)
    assert {c.dtype for c in CASES} == {BF16, FP16} and sum(c.dtype == BF16 for c in CASES) > len(CASES) / 2
    assert {(c.d, c.depth_grad) for c in CASES} == {(d, g) for d in (64, 128) for g in (True, False)}
    assert any(c.G == 32 and c.d == 128 for c in CASES)
    assert any(c.L == 256 and c.T <= 67 for c in CASES) and any(c.L == 256 and c.d == 128 for c in CASES)
    assert any(c.B > 1 for c in CASES) and any(c.T == 1 and c.L >= 64 for c in CASES)
    assert len(CASES) <= 10 and set(EXPECTED) == set(dispatch.IMPLS)
    biggest = max([c.shape for c in CASES] + [STRIDED.shape], key=lambda s: s.B * s.Hq * s.T * (s.T + s.L))
    assert biggest.B * biggest.Hq * biggest.T * (biggest.T + biggest.L) * 8 <= 3 * 2 ** 30


def test_spies_see_a_silent_fallback(routes):
    """On this CPU (interpreter) "fused" cannot run: moda_attention(impl="fused") runs Triton and
    gives Triton's result, and `ran` says so (the GPU tests' route check would fail on it)."""
    shape, dtype = MoDAShape(B=1, T=5, Hq=4, Hk=2, d=16, L=3), torch.float32
    assert dispatch.unavailable("fused", shape, dtype, "cpu") is not None
    assert dispatch.choose(shape, dtype, "cpu", impl="fused").impl == "triton"
    *inputs, do = random_inputs(1, 5, 4, 2, 16, 3, dtype, seed=1)
    got = _fwd_bwd(inputs, do, impl="fused")
    assert ran(routes) == EXPECTED["triton"] != EXPECTED["fused"]
    with pytest.raises(AssertionError, match="asked for fused"):
        assert_ran(routes, "fused")
    routes.clear()
    want = _fwd_bwd(inputs, do, impl="triton")
    assert_ran(routes, "triton")
    assert torch.equal(got[0], want[0]) and all(torch.equal(a, b) for a, b in zip(got[2], want[2]))


@pytest.mark.parametrize("impl", ["fa4", "overlap"])
def test_spies_name_the_fa4_routes(routes, monkeypatch, impl):
    """`dispatch.run` of fa4 / overlap with the torch sequence backend standing in for FA4 (interpreter):
    the spies see that route's placements, and `ran` refuses it for not running on FA4's backend."""
    monkeypatch.setattr(merge, "FA4_BACKEND", merge.TORCH_BACKEND)
    *inputs, do = random_inputs(1, 9, 4, 2, 16, 3, torch.float32, seed=2)
    out = dispatch.run(dispatch.Choice(impl, "test"), *inputs, scale=None, return_lse=False, depth_grad=True)
    out.backward(do)
    placements = {e[0]: e[1] for e in routes if e[0] in ("fwd", "bwd")}
    assert (placements["fwd"], placements["bwd"]) == EXPECTED[impl]
    assert ("run", impl) in routes and ("kernel", "fused") not in routes
    with pytest.raises(ValueError, match="torch sequence backend"):
        ran(routes)
