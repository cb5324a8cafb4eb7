"""Depth-Attention as one autograd node (`ops.dattn.chained`): the sequence backend's raw backward
chained into the fused mix's, whose kernel adds its dq / dk shares to the sequence dq / dk.

CPU (TRITON_INTERPRET=1): the plain-torch `TORCH_BACKEND` stands in for FA4's raw pair; out,
v_mixed and all five gradients against the fp64 reference at odd T, G in {1, 2, 4, 8}, S in
{1, 5}; the kernel's accumulate mode against write-then-add, into strided buffers; the
argument errors; which path `depth_attention` and the `dattn` providers take. The GPU case
(FA4's pair, bf16) runs in tests/test_dattn.py's gpu tests, whose default path is this node.
"""
from __future__ import annotations

import itertools

import pytest
import torch
from helpers import random_inputs, rel_err
from test_dattn import check_case

from moda_bench.kernels import dattn
from moda_bench.kernels.dattn import chain_backend, chained_depth_attention, depth_attention, depth_attention_reference
from moda_bench.kernels.dattn.attention import backend_for
from moda_bench.kernels.dattn.mix_triton import mix_bwd, mix_fwd
from moda_bench.kernels.moda.fa4.merge import FA4_BACKEND, TORCH_BACKEND


def run_chained(B, T, G, Hk, d, S, dtype, seed, *, tol=None, scale=None):
    """The chained node through depth_attention (raw backend) vs the fp64 reference: out, v_mixed
    and the five gradients of (out, v_mixed) (test_dattn.check_case)."""
    q, k, v, ks, vs, _ = random_inputs(1, 3, 2, 1, 16, 1, torch.float32, seed=0)
    out = depth_attention(q, k, v, ks, vs, attention=TORCH_BACKEND)
    assert "EagerChained" in type(out.grad_fn).__name__   # the path under test
    return check_case("triton", B, T, G, Hk, d, S, dtype, seed=seed, tol=tol, attention=TORCH_BACKEND,
                      **({"scale": scale} if scale is not None else {}))


GRID = list(itertools.product([1, 7, 33], [1, 2, 4, 8], [1, 5]))


@pytest.mark.parametrize("T,G,S", GRID, ids=[f"T{t}-G{g}-S{s}" for t, g, s in GRID])
def test_chained_grid_fp32(T, G, S):
    B = 2 if T <= 7 else 1
    Hk = 2 if G <= 4 else 1
    run_chained(B, T, G, Hk, 16 if (T + G) % 2 else 32, S, torch.float32, seed=T * 10 + G + S, tol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_chained_half_d64(dtype):
    run_chained(1, 29, 4, 2, 64, 3, dtype, seed=11)


def test_chained_scale_and_out_only():
    """A non-default depth-softmax scale; then only out differentiated (no gradient reaches the
    node's v_mixed output: the mix's backward gets the attention's dv_mixed alone)."""
    run_chained(1, 13, 2, 2, 32, 2, torch.float32, seed=3, scale=0.3, tol=1e-4)
    q, k, v, ks, vs, do = random_inputs(1, 13, 4, 2, 32, 2, torch.float32, seed=4)
    grads = torch.autograd.grad(chained_depth_attention(q, k, v, ks, vs, TORCH_BACKEND)[0], (q, k, v, ks, vs), do)
    ref = depth_attention_reference(q, k, v, ks, vs, compute_dtype=torch.float64, out_dtype=torch.float64)
    ref_grads = torch.autograd.grad(ref, (q, k, v, ks, vs), do.double())
    assert max(rel_err(g, r) for g, r in zip(grads, ref_grads)) < 1e-4


def test_chained_v_mixed_only():
    """Only v_mixed differentiated: the attention's output gradient is missing (zeros)."""
    q, k, v, ks, vs, _ = random_inputs(1, 9, 4, 2, 16, 2, torch.float32, seed=5)
    dvm = torch.randn(1, 9, 2, 16)
    _, vm = chained_depth_attention(q, k, v, ks, vs, TORCH_BACKEND)
    grads = torch.autograd.grad(vm, (q, k, v, ks, vs), dvm)
    ref = dattn.mix_reference(q, k, v, ks, vs, out_dtype=torch.float64)
    ref_grads = torch.autograd.grad(ref, (q, k, v, ks, vs), dvm.double())
    assert rel_err(vm, ref) < 1e-5
    assert max(rel_err(g, r) for g, r in zip(grads, ref_grads)) < 1e-5


def test_mix_bwd_accumulates_into_strided_buffers():
    """dq_into / dk_into: the kernel adds its dq share and dk to what they hold, strided buffers
    (heads-major storage, unit last stride) included, and returns them; the other gradients are
    as without accumulation."""
    B, T, Hk, G, d, S = 2, 13, 2, 4, 16, 3
    q, k, v, ks, vs, _ = random_inputs(B, T, G * Hk, Hk, d, S, torch.float32, seed=8)
    shape = dattn.check_dattn_inputs(q, k, v, ks, vs)
    dvm = torch.randn(B, T, Hk, d)
    _, lse = mix_fwd(q, k, v, ks, vs, 0.25, shape)
    plain = mix_bwd(dvm, q, k, v, ks, vs, lse, 0.25, shape)
    base_q = torch.randn(B, G * Hk, T, d).transpose(1, 2)  # (B,T,Hq,d) view, not contiguous
    base_k = torch.randn(B, Hk, T, d).transpose(1, 2)
    want_q, want_k = base_q + plain[0], base_k + plain[1]
    got = mix_bwd(dvm, q, k, v, ks, vs, lse, 0.25, shape, dq_into=base_q, dk_into=base_k)
    assert got[0] is base_q and got[1] is base_k
    assert rel_err(base_q, want_q) < 1e-6 and rel_err(base_k, want_k) < 1e-6
    for a, b in zip(got[2:], plain[2:]):
        assert rel_err(a, b) < 1e-6


def test_mix_bwd_accumulate_argument_errors():
    q, k, v, ks, vs, _ = random_inputs(1, 5, 4, 2, 16, 1, torch.float32, seed=1)
    shape = dattn.check_dattn_inputs(q, k, v, ks, vs)
    dvm = torch.randn(1, 5, 2, 16)
    _, lse = mix_fwd(q, k, v, ks, vs, 0.25, shape)
    with pytest.raises(ValueError, match="both dq_into and dk_into"):
        mix_bwd(dvm, q, k, v, ks, vs, lse, 0.25, shape, dq_into=torch.zeros_like(q))
    with pytest.raises(ValueError, match=r"dk_into must match \(1, 5, 2, 16\)"):
        mix_bwd(dvm, q, k, v, ks, vs, lse, 0.25, shape, dq_into=torch.zeros_like(q), dk_into=torch.zeros(1, 5, 2, 8))
    with pytest.raises(ValueError, match="dq_into must match .* unit last stride"):
        mix_bwd(dvm, q, k, v, ks, vs, lse, 0.25, shape, dq_into=torch.zeros(1, 5, 16, 4).transpose(2, 3),
                dk_into=torch.zeros_like(k))


def test_chained_argument_errors():
    q, k, v, ks, vs, _ = random_inputs(1, 5, 4, 2, 16, 2, torch.float32, seed=2)
    with pytest.raises(ValueError, match="chains with the Triton mix at S >= 1 only .*mix='torch'"):
        depth_attention(q, k, v, ks, vs, mix="torch", attention=TORCH_BACKEND)
    with pytest.raises(ValueError, match="S=0"):
        depth_attention(q, k, v, attention=TORCH_BACKEND)
    with pytest.raises(ValueError, match="needs S >= 1"):
        chained_depth_attention(q, k, v, None, None, TORCH_BACKEND)
    with pytest.raises(ValueError, match="the fa4 sequence backend takes"):
        chained_depth_attention(q, k, v, ks, vs, FA4_BACKEND)   # float32 inputs
    with pytest.raises(TypeError, match="a SequenceBackend or None"):
        depth_attention(q, k, v, ks, vs, attention=3)


def test_default_path_chains_only_where_fa4_runs(monkeypatch):
    """attention=None: composed on a CPU (no FA4); FA4's pair chained where FA4 can run."""
    from moda_bench.kernels.moda.fa4 import merge as fa4
    assert chain_backend("cpu") is None
    q, k, v, ks, vs, _ = random_inputs(1, 7, 4, 2, 16, 1, torch.float32, seed=6)
    out = depth_attention(q, k, v, ks, vs)
    assert "EagerChained" not in type(out.grad_fn).__name__
    backend_for.cache_clear()
    monkeypatch.setattr(fa4, "fa4_unavailable", lambda device=None: None)
    try:
        assert chain_backend("cpu", torch.bfloat16) is FA4_BACKEND
        assert chain_backend("cpu", torch.float32) is None
    finally:
        backend_for.cache_clear()


def test_providers_say_which_path_runs():
    """`dattn` chains where it can and says so in impl_detail / config; `dattn-composed` never
    chains; both are registered with the S axis."""
    from moda_bench.bench.providers import get_provider
    from moda_bench.bench.runner import Point
    from moda_bench.timing import make_inputs
    point = Point(T=9, G=2, Hk=2, d=16, L=2, S=2, dtype="float32")
    inputs = make_inputs(1, 9, 4, 2, 16, 2, dtype=torch.float32, device="cpu", seed=1)
    for name in ("dattn", "dattn-composed"):
        prov = get_provider(name, "train")
        assert prov.depth_axis == "S" and prov.kind == "dattn"
        prep = prov.prepare(inputs, point, None)
        assert prep.config["chained"] is False   # no FA4 on a CPU: composed by autograd
        assert "composed by autograd" in prep.impl_detail
        out = prep.forward()
        ref = depth_attention_reference(*(inputs[n] for n in ("q", "k", "v", "k_depth", "v_depth")),
                                        out_dtype=torch.float64)
        assert rel_err(out, ref) < 1e-4
