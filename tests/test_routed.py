"""`routed.moda_route_into` (CPU, Triton interpreter): a non-Triton route's depth gradients go into
the caller's buffer slices, added to what is there, and nowhere else.

The route is "fa4" with `merge.moda_fa4` run on its plain-torch sequence backend (`TORCH_BACKEND`,
the route's own code but FA4 itself: the depth-only Triton launches, the merge, the backward's
dq sum), so it runs here. fp32 against the fp64 `moda_reference`: ||err|| / ||ref|| < 1e-4 for
the output and every gradient (`helpers.TOLERANCE`). On the GPU (`-m gpu`) each FA4 route itself,
bf16 (2e-2).
"""
from __future__ import annotations

import pytest
import torch
from helpers import TOLERANCE, random_inputs, rel_err

from moda_bench.kernels.moda import dispatch, moda_reference
from moda_bench.kernels.moda.fa4 import merge
from moda_bench.kernels.moda.routed import moda_route_into


@pytest.fixture
def torch_fa4(monkeypatch):
    """`merge.moda_fa4` (what dispatch.run calls for "fa4") on the plain-torch sequence backend;
    records each call's depth_grad."""
    real, calls = merge.moda_fa4, []

    def route(*args, depth_grad=True, **kw):
        calls.append(depth_grad)
        return real(*args, depth_grad=depth_grad, backend=merge.TORCH_BACKEND, **kw)
    monkeypatch.setattr(merge, "moda_fa4", route)
    return calls


def check_route_into(impl, dtype, dev, B=1, T=13, Hq=4, Hk=2, d=16, L=3, E=5, first=1):
    """moda_route_into(impl) on depth K/V that are slices [first, first + L) of (B, T, E, Hk, d)
    buffers, against the fp64 reference (`helpers.TOLERANCE`): out, q/k/v gradients, the depth
    gradients added into the gradient buffers' slice (prefilled: random in fp32; zeros in 16-bit,
    whose rounding of a sum would swamp the check) and nothing outside it, the buffers themselves
    no gradient."""
    tol = TOLERANCE[dtype]
    q, k, v, _, _, do = random_inputs(B, T, Hq, Hk, d, 0, dtype, seed=2, dev=dev)
    g = torch.Generator().manual_seed(5)
    buf_k, buf_v = (torch.randn(B, T, E, Hk, d, generator=g).to(dev, dtype).requires_grad_(True) for _ in range(2))
    before = [torch.randn(B, T, E, Hk, d, generator=g).to(dev, dtype) * (dtype == torch.float32) for _ in range(2)]
    gk, gv = (t.clone() for t in before)
    sl = slice(first, first + L)
    kd, vd = buf_k[:, :, sl], buf_v[:, :, sl]                   # strided slices of one buffer, as a model reads
    out = moda_route_into(dispatch.Choice(impl, "test"), q, k, v, kd, vd, gk[:, :, sl], gv[:, :, sl])
    out.backward(do)

    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v, kd, vd)]
    ref = moda_reference(*leaves, out_dtype=torch.float64)
    ref.backward(do.double())
    assert rel_err(out, ref) < tol
    for got, want in zip((q.grad, k.grad, v.grad), leaves[:3]):
        assert rel_err(got, want.grad) < tol
    assert buf_k.grad is None and buf_v.grad is None           # the depth K/V get no gradient of their own
    for into, start, want in ((gk, before[0], leaves[3].grad), (gv, before[1], leaves[4].grad)):
        assert rel_err((into - start)[:, :, sl].double(), want) < tol     # exactly the depth gradients, added
        assert torch.equal(into[:, :, :first], start[:, :, :first])
        assert torch.equal(into[:, :, first + L:], start[:, :, first + L:])


@pytest.mark.parametrize("impl", ["fa4", "triton"])
def test_route_into_adds_the_depth_gradients_into_the_buffer_slices(torch_fa4, impl):
    check_route_into(impl, torch.float32, "cpu")
    assert torch_fa4 == ([True] if impl == "fa4" else [])


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["fa4", "overlap", "fused"])
def test_gpu_route_into_each_route(monkeypatch, impl):
    """Each FA4 route on the GPU (bf16, G=2 as seed 000's 700M, an odd T, a slice of a wider buffer),
    with a check that the route itself ran (`dispatch.run` sees it); skips where it cannot run here."""
    from moda_bench.kernels.moda.validate import MoDAShape
    shape = MoDAShape(B=2, T=131, Hq=16, Hk=8, d=64, L=5)
    why = dispatch.unavailable(impl, shape, torch.bfloat16, "cuda")
    if why is not None:
        pytest.skip(why)
    real, ran = dispatch.run, []
    monkeypatch.setattr(dispatch, "run", lambda choice, *a, **kw: ran.append(choice.impl) or real(choice, *a, **kw))
    check_route_into(impl, torch.bfloat16, "cuda", B=2, T=131, Hq=16, Hk=8, d=64, L=5, E=9, first=2)
    assert ran == [impl]


def test_route_into_refuses_no_depth_and_unknown_routes():
    q, k, v, kd, vd, _ = random_inputs(1, 5, 2, 1, 16, 2, torch.float32, dev="cpu")
    gk, gv = torch.zeros_like(kd), torch.zeros_like(vd)
    with pytest.raises(ValueError, match="needs depth K/V"):
        moda_route_into(dispatch.Choice("fa4", "test"), q, k, v, kd[:, :, :0], vd[:, :, :0], gk[:, :, :0],
                        gv[:, :, :0])
    with pytest.raises(ValueError, match="impl must be one of"):
        moda_route_into(dispatch.Choice("fa9", "test"), q, k, v, kd, vd, gk, gv)
