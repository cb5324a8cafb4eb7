"""The MoDA backward's `depth_grad_into` option (issue 59): the depth K/V gradients added in the
kernel to a caller's buffer (slices of a model-wide depth gradient buffer), against the fp64
reference, for every pointer placement, odd T and L in {1, 7}; the slots outside the slice and the
sequence gradients are as without the option. Tolerances: float32 kernels against float64,
relative error <= 1e-4 of each tensor's largest value."""
from __future__ import annotations

import math

import pytest
import torch
from helpers import random_inputs

from moda_bench.kernels.moda import MoDAConfig, moda_attention, moda_reference
from moda_bench.kernels.moda.triton import interface as kernel_mod
from moda_bench.kernels.moda.validate import check_inputs

TOL = 1e-4


def _cfg(placement: str) -> MoDAConfig:
    return MoDAConfig(block_m=16, block_n=16, depth_block_m=16, bwd_q_block_m=16, bwd_kv_block_m=16,
                      bwd_kv_block_n=16, block_l=16, bwd_block_l=16, fwd_depth="fused", bwd_depth=placement)


def _rel(a, b) -> float:
    return float((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-12))


@pytest.mark.parametrize("placement", ["fused", "split", "overlap", "tma"])
@pytest.mark.parametrize("L", [1, 7])
def test_depth_gradients_are_added_to_the_callers_buffer(placement, L):
    B, T, Hq, Hk, d, E, first = 1, 13, 4, 2, 16, 9, 1
    q, k, v, _, _, do = random_inputs(B, T, Hq, Hk, d, 0, torch.float32, seed=11 + L)
    g = torch.Generator().manual_seed(L)
    bk, bv = (torch.randn(B, T, E, Hk, d, generator=g) for _ in range(2))
    kd, vd = bk[:, :, first:first + L], bv[:, :, first:first + L]          # strided slices, read in place
    gk0, gv0 = (torch.randn(B, T, E, Hk, d, generator=g) for _ in range(2))  # what the buffer held before
    gk, gv = gk0.clone(), gv0.clone()
    scale = 1.0 / math.sqrt(d)
    cfg = _cfg(placement)
    with torch.no_grad():
        out, lse = moda_attention(q, k, v, kd, vd, return_lse=True, config=cfg)
    shape = check_inputs(q, k, v, kd, vd, need_cuda=True)
    into = (gk[:, :, first:first + L], gv[:, :, first:first + L])
    dq, dk, dv, dkd, dvd = kernel_mod.moda_bwd(do, q, k, v, kd, vd, out, lse, scale, shape, cfg,
                                               depth_grad_into=into)
    assert dkd is into[0] and dvd is into[1]

    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v, kd, vd)]
    moda_reference(*leaves, scale=scale).backward(do.double())
    rq, rk, rv, rkd, rvd = (t.grad for t in leaves)
    for got, want in ((dq, rq), (dk, rk), (dv, rv)):
        assert _rel(got, want) <= TOL
    sl = slice(first, first + L)
    assert _rel(gk[:, :, sl] - gk0[:, :, sl], rkd) <= TOL and _rel(gv[:, :, sl] - gv0[:, :, sl], rvd) <= TOL
    outside = torch.ones(E, dtype=torch.bool)
    outside[sl] = False
    assert torch.equal(gk[:, :, outside], gk0[:, :, outside]) and torch.equal(gv[:, :, outside], gv0[:, :, outside])


def _forward_saved(T: int, L: int, seed: int):
    """(q, k, v, kd, vd, do, out, lse, shape, cfg) of a small float32 call, the forward run with the
    "fused" pointer placement: what `moda_bwd` takes."""
    q, k, v, kd, vd, do = random_inputs(1, T, 2, 1, 16, L, torch.float32, seed=seed)
    cfg = _cfg("fused")
    with torch.no_grad():
        out, lse = moda_attention(q, k, v, kd, vd, return_lse=True, config=cfg)
    return q, k, v, kd, vd, do, out, lse, check_inputs(q, k, v, kd, vd, need_cuda=True), cfg


def test_without_depth_grad_the_buffer_is_left_alone():
    q, k, v, kd, vd, do, out, lse, shape, cfg = _forward_saved(T=9, L=3, seed=2)
    gk, gv = torch.ones_like(kd), torch.ones_like(vd)
    res = kernel_mod.moda_bwd(do, q, k, v, kd, vd, out, lse, 0.25, shape, cfg, depth_grad=False,
                              depth_grad_into=(gk, gv))
    assert res[3] is None and res[4] is None
    assert torch.equal(gk, torch.ones_like(kd)) and torch.equal(gv, torch.ones_like(vd))


@pytest.mark.parametrize("bad, match", [
    (lambda kd: (kd,), "a pair"),
    (lambda kd: (torch.zeros_like(kd[:, :, :1]), torch.zeros_like(kd)), "must match k_depth"),
    (lambda kd: (torch.zeros_like(kd), torch.zeros_like(kd).double()), "must match k_depth"),
    (lambda kd: (torch.zeros_like(kd), torch.zeros(kd.shape[:2] + (3,) + kd.shape[3:])[:, :, :2]), "set of strides"),
])
def test_a_bad_buffer_is_one_line_error(bad, match):
    q, k, v, kd, vd, do, out, lse, shape, cfg = _forward_saved(T=5, L=2, seed=4)
    with pytest.raises(ValueError, match=match):
        kernel_mod.moda_bwd(do, q, k, v, kd, vd, out, lse, 0.25, shape, cfg, depth_grad_into=bad(kd))


def test_the_decoder_adds_depth_gradients_in_the_kernel(monkeypatch):
    """MoDA's attached training step with the addition in the kernel hands every layer that reads
    depth its slice of the buffer's gradient slots (`moda_bwd`'s depth_grad_into); after the
    kernel, none; both give the same gradients (float32, relative error <= 1e-5: the additions
    round in another order)."""
    from moda_bench.models import Decoder, ModelConfig
    cfg = ModelConfig("tiny", hidden=32, intermediate=48, layers=4, heads=2, kv_heads=1, vocab=23, seq_len=9,
                      dtype="float32", tie_embeddings=False, dattn_stride=1)
    torch.manual_seed(0)
    model = Decoder(cfg, ("moda",), init_std=0.3)
    tokens = torch.randint(0, cfg.vocab, (2, cfg.seq_len + 1))
    seen = []
    real = kernel_mod.moda_bwd

    def spy(*args, depth_grad_into=None, **kw):
        seen.append(None if depth_grad_into is None else depth_grad_into[0].shape[2])
        return real(*args, depth_grad_into=depth_grad_into, **kw)

    monkeypatch.setattr(kernel_mod, "moda_bwd", spy)
    grads = {}
    for on in (True, False):
        monkeypatch.setattr(Decoder, "depth_grad_in_kernel", on)
        model.zero_grad(set_to_none=True)
        seen.clear()
        model.loss(tokens, "moda").backward()
        grads[on] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        assert sorted(seen, key=lambda x: x or 0) == ([None] + [2, 4, 6] if on else [None] * 4)
    assert grads[True].keys() == grads[False].keys() and any("ffn_kv" in n for n in grads[True])
    for n, g in grads[True].items():
        assert _rel(g, grads[False][n].double()) <= 1e-5, n


@pytest.mark.parametrize("placement, in_kernel", [("fused", None), ("fused", False), ("tma", None), ("tma", False)])
def test_moda_attention_into_adds_to_the_buffer_in_or_after_the_kernel(monkeypatch, placement, in_kernel):
    """`moda_attention_into`: q, k, v get their gradients, the depth K/V none, and the buffer
    slices what they held plus the depth gradients (fp64 reference, relative error <= 1e-4);
    by default in the kernel, the descriptor backward ("tma") included."""
    from moda_bench.kernels.moda.triton.accumulate import moda_attention_into
    B, T, Hq, Hk, d, L, E = 1, 11, 4, 2, 16, 3, 5
    q, k, v, _, _, do = random_inputs(B, T, Hq, Hk, d, 0, torch.float32, seed=7)
    g = torch.Generator().manual_seed(3)
    bk, bv = (torch.randn(B, T, E, Hk, d, generator=g) for _ in range(2))
    gk0, gv0 = (torch.randn(B, T, E, Hk, d, generator=g) for _ in range(2))
    gk, gv = gk0.clone(), gv0.clone()
    kd = bk[:, :, :L].detach().requires_grad_(True)
    vd = bv[:, :, :L].detach().requires_grad_(True)
    calls = []
    real = kernel_mod.moda_bwd
    monkeypatch.setattr(kernel_mod, "moda_bwd", lambda *a, **kw: calls.append(kw.get("depth_grad_into")) or
                        real(*a, **kw))
    out = moda_attention_into(q, k, v, kd, vd, gk[:, :, :L], gv[:, :, :L], config=_cfg(placement),
                              in_kernel=in_kernel)
    out.backward(do)
    assert (calls[0] is not None) == (in_kernel is not False)
    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v, kd, vd)]
    moda_reference(*leaves).backward(do.double())
    for got, want in zip((q.grad, k.grad, v.grad), leaves[:3]):
        assert _rel(got, want.grad) <= TOL
    assert kd.grad is None and vd.grad is None
    assert _rel(gk[:, :, :L] - gk0[:, :, :L], leaves[3].grad) <= TOL
    assert _rel(gv[:, :, :L] - gv0[:, :, :L], leaves[4].grad) <= TOL
    assert torch.equal(gk[:, :, L:], gk0[:, :, L:])
