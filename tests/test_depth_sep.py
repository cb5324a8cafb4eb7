"""depth-sep (issue 58, item 4): the seeds' variant (c), sequence attention plus a separate softmax
over each position's depth entries. CPU tests under TRITON_INTERPRET=1 (conftest sets it without a
GPU) against the fp64 reference
(forward and all five gradients, odd sizes), input validation, and the provider's rows.

Tolerances (relative Frobenius error vs fp64): fp32 1e-5, bf16 2e-2 (8 mantissa bits, sums of
at most a few hundred terms)."""
from __future__ import annotations

import math

import pytest
import torch

from moda_bench.kernels.dattn import torch_causal_attention
from moda_bench.kernels.moda.depth_sep import (
    depth_sep_attention,
    depth_sep_reference,
    depth_softmax,
    depth_softmax_reference,
)
from moda_bench.kernels.moda.reference import moda_reference

NAMES = ("q", "k", "v", "k_depth", "v_depth")


def inputs(B, T, Hk, G, L, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, T, Hk * G, d), (B, T, Hk, d), (B, T, Hk, d), (B, T, L, Hk, d), (B, T, L, Hk, d)]
    return [torch.randn(s, generator=g).to(dtype).requires_grad_() for s in shapes]


def rel(a, b):
    """||a - b|| / ||b||; ||a|| where b is zero (L = 1: a softmax over one entry has no key gradient)."""
    diff, norm = (a.detach().double() - b.detach()).norm(), b.detach().norm()
    return float(diff / norm if norm > 0 else diff)


def check(args, tol, attention=torch_causal_attention):
    out = depth_sep_attention(*args, attention=attention)
    ref_in = [x.detach().double().requires_grad_() for x in args]
    ref = depth_sep_reference(*ref_in, out_dtype=torch.float64)
    assert out.dtype == args[0].dtype and out.shape == args[0].shape
    assert rel(out, ref) < tol
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).to(device=out.device, dtype=out.dtype)
    out.backward(do)
    ref.backward(do.double())
    for name, x, r in zip(NAMES, args, ref_in):
        assert rel(x.grad, r.grad) < tol, name


@pytest.mark.parametrize("B,T,Hk,G,L,d", [(1, 7, 1, 1, 1, 16), (2, 13, 2, 3, 5, 16), (1, 9, 3, 5, 17, 32),
                                          (1, 5, 1, 8, 3, 64)])
def test_fp32_forward_and_gradients_odd_sizes(B, T, Hk, G, L, d):
    check(inputs(B, T, Hk, G, L, d), 1e-5)


def test_bf16_with_the_default_sequence_backend():
    check(inputs(1, 11, 2, 2, 3, 16, dtype=torch.bfloat16), 2e-2, attention=None)   # Triton kernel at L = 0


def test_depth_part_alone_and_what_makes_it_variant_c():
    q, k, v, kd, vd = inputs(1, 6, 2, 2, 4, 16)
    part = depth_softmax(q, kd, vd)
    ref = depth_softmax_reference(q.detach().double(), kd.detach().double(), vd.detach().double())
    assert rel(part, ref) < 1e-5
    # each query's depth weights sum to one on their own: constant depth values come back unchanged
    same = torch.ones_like(vd)
    assert torch.allclose(depth_softmax(q, kd, same), torch.ones_like(q))
    # one softmax over T + L keys (MoDA) is a different function of the same inputs
    args = [x.detach().double() for x in (q, k, v, kd, vd)]
    assert rel(moda_reference(*args, out_dtype=torch.float64), depth_sep_reference(*args)) > 1e-2
    # L = 0: the sequence attention alone
    assert torch.equal(depth_sep_attention(q, k, v, attention=torch_causal_attention), torch_causal_attention(q, k, v))


def test_scale_applies_to_the_depth_softmax():
    q, k, v, kd, vd = (x.detach() for x in inputs(1, 4, 1, 2, 3, 16))
    got = depth_softmax(q, kd, vd, scale=0.5)
    want = depth_softmax_reference(q.double(), kd.double(), vd.double(), scale=0.5)
    assert rel(got, want) < 1e-5 and rel(got, depth_softmax_reference(q.double(), kd.double(), vd.double())) > 1e-3


def test_bad_input_one_line_errors(monkeypatch):
    q, k, v, kd, vd = (x.detach() for x in inputs(1, 4, 2, 2, 3, 16))
    with pytest.raises(ValueError, match="both be given"):
        depth_sep_attention(q, k, v, kd, None)
    with pytest.raises(ValueError, match="v_depth"):
        depth_sep_attention(q, k, v, kd, vd[:, :, :2])
    with pytest.raises(ValueError, match="L >= 1"):
        depth_softmax(q, kd[:, :, :0], vd[:, :, :0])
    with pytest.raises(ValueError, match="k_depth must be"):
        depth_softmax(q, kd[:, :, 0], vd)
    with pytest.raises(TypeError):
        depth_sep_attention(q, k.double(), v, kd, vd)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="CUDA|TRITON_INTERPRET"):
        depth_softmax(q, kd, vd)


def test_provider_rows_in_the_schema(tmp_path):
    from moda_bench import schema
    from moda_bench.bench import providers
    from moda_bench.bench.runner import Point, plan_points, run_sweep
    from moda_bench.bench.spec import RunSpec
    prov = providers.get_provider("depth-sep")
    assert prov.uses_depth and prov.kind == "moda" and prov.unavailable("cpu") is None
    frame = run_sweep(plan_points("T", [21], Point(T=21, G=3, Hk=1, L=5, B=1, d=16, C=16, dtype="float32")),
                      RunSpec(("depth-sep", "moda"), "fwdbwd"), tmp_path / "sweep_T.csv", sweep_name="T",
                      device="cpu", timer=lambda fn, **kw: {"median_ms": 2.0, "p20_ms": 2.0, "p80_ms": 2.0},
                      progress=False)
    rows = frame.set_index("provider")
    assert list(frame.columns) == schema.COLUMNS
    assert rows.at["depth-sep", "status"] == "ok", rows.at["depth-sep", "reason"]
    assert rows.at["depth-sep", "max_rel_err"] < 1e-4          # against its own reference, not MoDA's
    assert math.isclose(rows.at["depth-sep", "depth_utilization"], 3 / 16)
    assert rows.at["depth-sep", "flops"] == rows.at["moda", "flops"]


def test_too_deep_a_tile_is_refused():
    q = torch.randn(1, 2, 2, 128)
    kd = torch.randn(1, 2, 257, 2, 128)
    with pytest.raises(ValueError, match="L=257, d=128"):
        depth_softmax(q, kd, kd)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("G,L,d", [(8, 64, 64), (2, 256, 64), (8, 64, 128)])
def test_gpu_paper_shapes_bf16(G, L, d):
    """On the GPU at the paper preset's shapes (bf16), through the default sequence backend."""
    args = [x.detach().cuda().requires_grad_() for x in inputs(1, 1024, 8, G, L, d, dtype=torch.bfloat16)]
    check(args, 2e-2, attention=None)
