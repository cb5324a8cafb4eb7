"""`routed.moda_route_into` (CPU, Triton interpreter): a non-Triton route's depth gradients go into
the caller's buffer slices, added to what is there, and nowhere else.

The route is "fa4" with `merge.moda_fa4` run on its plain-torch sequence backend (`TORCH_BACKEND`,
the route's own code but FA4 itself: the depth-only Triton launches, the merge, the backward's
dq sum), so it runs here. fp32 against the fp64 `moda_reference`: ||err|| / ||ref|| < 1e-4 for
the output and every gradient; the depth gradients added into the buffer to 1e-6 absolute.
"""
from __future__ import annotations

import pytest
import torch
from helpers import random_inputs, rel_err

from moda_bench.kernels.moda import dispatch, moda_reference
from moda_bench.kernels.moda.fa4 import merge
from moda_bench.kernels.moda.routed import moda_route_into

TOL = 1e-4


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


@pytest.mark.parametrize("impl", ["fa4", "triton"])
def test_route_into_adds_the_depth_gradients_into_the_buffer_slices(torch_fa4, impl):
    B, T, Hq, Hk, d, L, E = 1, 13, 4, 2, 16, 3, 5
    q, k, v, _, _, do = random_inputs(B, T, Hq, Hk, d, 0, torch.float32, seed=2, dev="cpu")
    g = torch.Generator().manual_seed(5)
    buf_k, buf_v = (torch.randn(B, T, E, Hk, d, generator=g).requires_grad_(True) for _ in range(2))
    before = [torch.randn(B, T, E, Hk, d, generator=g) for _ in range(2)]
    gk, gv = (t.clone() for t in before)
    kd, vd = buf_k[:, :, 1:1 + L], buf_v[:, :, 1:1 + L]        # strided slices of one buffer, as a model reads
    out = moda_route_into(dispatch.Choice(impl, "test"), q, k, v, kd, vd, gk[:, :, 1:1 + L], gv[:, :, 1:1 + L])
    out.backward(do)
    assert torch_fa4 == ([True] if impl == "fa4" else [])

    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v, kd, vd)]
    ref = moda_reference(*leaves, out_dtype=torch.float64)
    ref.backward(do.double())
    assert rel_err(out, ref) < TOL
    for got, want in zip((q.grad, k.grad, v.grad), leaves[:3]):
        assert rel_err(got, want.grad) < TOL
    assert buf_k.grad is None and buf_v.grad is None           # the depth K/V get no gradient of their own
    for into, start, want in ((gk, before[0], leaves[3].grad), (gv, before[1], leaves[4].grad)):
        added = (into - start)[:, :, 1:1 + L].double()
        assert rel_err(added, want) < TOL                       # exactly the depth gradients, added
        assert torch.equal(into[:, :, :1], start[:, :, :1]) and torch.equal(into[:, :, 1 + L:], start[:, :, 1 + L:])


def test_route_into_refuses_no_depth_and_unknown_routes():
    q, k, v, kd, vd, _ = random_inputs(1, 5, 2, 1, 16, 2, torch.float32, dev="cpu")
    gk, gv = torch.zeros_like(kd), torch.zeros_like(vd)
    with pytest.raises(ValueError, match="needs depth K/V"):
        moda_route_into(dispatch.Choice("fa4", "test"), q, k, v, kd[:, :, :0], vd[:, :, :0], gk[:, :, :0],
                        gv[:, :, :0])
    with pytest.raises(ValueError, match="impl must be one of"):
        moda_route_into(dispatch.Choice("fa9", "test"), q, k, v, kd, vd, gk, gv)
