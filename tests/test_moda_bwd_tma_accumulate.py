"""The descriptor backward (`bwd_depth="tma"`) with strided depth K/V and DEPTH_ACC (issue 59): a
model's one depth-KV buffer and one depth gradient buffer, each layer's slots [a, b) handed in
place; the depth gradients added into the gradient buffer's slice in the kernel.

Against the fp64 reference at odd T (37, 45), G in {1, 3, 8}, L in {1, 5, 19}, fp32 and bf16, the
gradient buffer pre-filled with random values (the slice must hold prefill + gradient; the slots
outside it untouched); host-side descriptors, device-side ones and the pointer fallback; the two
launches, the one launch and depth items; detached depth (the buffer untouched); no copy of the
depth slice (the launches get the slices' own pointers, the descriptors their real strides).
Tolerances: helpers.TOLERANCE on ||err|| / ||gradient|| (fp32 1e-4, bf16 2e-2); fp32 also bitwise
against the contiguous call plus torch's addition (one rounding either way).
CPU: the Triton interpreter runs the kernels (conftest sets TRITON_INTERPRET=1).
"""
from __future__ import annotations

import math

import pytest
import torch
from helpers import TOLERANCE, device, rel_err, small_tma_config

from moda_bench.kernels.moda import moda_attention, moda_reference
from moda_bench.kernels.moda.config import default_config
from moda_bench.kernels.moda.triton import bwd_tma, descriptors
from moda_bench.kernels.moda.triton import interface as kernel_mod
from moda_bench.kernels.moda.validate import check_inputs

# the launches' argument positions of (KD, VD, DKD, DVD)
AT = {"_DQ_LAUNCH": (3, 4, 11, 12), "_KV_LAUNCH": (12, 13, 15, 16), "_ONE_LAUNCH": (3, 4, 17, 18)}


def _case(B, T, Hq, Hk, d, L, dtype, seed, first=2, extra=3):
    """q, k, v, do, the depth K/V buffers (B, T, L + extra, Hk, d) and their slices [first, first + L),
    the gradient buffers (another slot count: other strides) pre-filled, and out, lse of the forward."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device(), dtype)
    q, k, v, do = rnd(B, T, Hq, d), rnd(B, T, Hk, d), rnd(B, T, Hk, d), rnd(B, T, Hq, d)
    bk, bv = rnd(B, T, L + extra, Hk, d), rnd(B, T, L + extra, Hk, d)
    gk0, gv0 = rnd(B, T, L + extra + 1, Hk, d), rnd(B, T, L + extra + 1, Hk, d)
    sl = slice(first, first + L)
    kd, vd = bk[:, :, sl], bv[:, :, sl]
    assert not kd.is_contiguous()
    with torch.no_grad():
        out, lse = moda_attention(q, k, v, kd.contiguous(), vd.contiguous(), return_lse=True)
    return q, k, v, do, kd, vd, gk0, gv0, sl, out, lse


def _reference(q, k, v, kd, vd, do, scale):
    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v, kd, vd)]
    moda_reference(*leaves, scale=scale).backward(do.double())
    return [t.grad for t in leaves]


def _bwd(q, k, v, do, kd, vd, out, lse, cfg, into=None, depth_grad=True):
    scale = 1.0 / math.sqrt(q.shape[-1])
    shape = check_inputs(q, k, v, kd, vd, need_cuda=True)
    return kernel_mod.moda_bwd(do, q, k, v, kd, vd, out, lse, scale, shape, cfg, depth_grad=depth_grad,
                               depth_grad_into=into)


def _strides(x):
    """A host-side descriptor's strides as a tuple (None for a tensor)."""
    return tuple(int(s) for s in x.strides) if hasattr(x, "block_shape") else None


def _spy(monkeypatch):
    """Records, for every descriptor-backward launch, the tensors at (KD, VD, DKD, DVD) and the
    host-side descriptors built for them (their base pointers and strides), if any."""
    seen = []
    for name, at in AT.items():
        real = getattr(bwd_tma, name)

        def spy(key, grid, args, meta, descs=None, real=real, at=at, name=name):
            d = descs() if descs is not None else None
            seen.append((name, tuple(args[i] for i in at),
                         None if d is None else tuple(_strides(d[i]) for i in at)))
            return real(key, grid, args, meta, descs)
        monkeypatch.setattr(bwd_tma, name, spy)
    return seen


CASES = [  # (B, T, G, L, dtype, config fields)
    (1, 37, 8, 5, torch.float32, {}),
    (2, 45, 3, 19, torch.float32, dict(bwd_q_block_m=16, bwd_kv_block_m=16)),
    (1, 45, 1, 1, torch.float32, dict(bwd_block_l=32)),
    (1, 37, 3, 1, torch.bfloat16, dict(bwd_q_block_m=16, bwd_kv_block_m=16)),
    (1, 45, 8, 19, torch.bfloat16, {}),
    (1, 37, 1, 5, torch.bfloat16, dict(bwd_block_l=32)),
]


@pytest.mark.parametrize("B,T,G,L,dtype,kw", CASES,
                         ids=[f"T{c[1]}-G{c[2]}-L{c[3]}-{str(c[4])[6:]}" for c in CASES])
def test_depth_gradients_added_into_strided_buffer(monkeypatch, B, T, G, L, dtype, kw):
    Hk, d = 2, 32
    q, k, v, do, kd, vd, gk0, gv0, sl, out, lse = _case(B, T, G * Hk, Hk, d, L, dtype, seed=T + G + L)
    ref = _reference(q, k, v, kd, vd, do, 1.0 / math.sqrt(d))
    # prefill of the gradients' own rms (a bf16 rounding of prefill + gradient then costs ~2^-9 of it)
    gk0, gv0 = (g * r.pow(2).mean().sqrt().to(dtype) for g, r in zip((gk0, gv0), ref[3:]))
    gk, gv = gk0.clone(), gv0.clone()
    seen = _spy(monkeypatch)
    cfg = small_tma_config(bwd_kv_beside=0, **kw)
    dq, dk, dv, dkd, dvd = _bwd(q, k, v, do, kd, vd, out, lse, cfg, into=(gk[:, :, sl], gv[:, :, sl]))
    assert dkd.data_ptr() == gk[:, :, sl].data_ptr() and dvd.data_ptr() == gv[:, :, sl].data_ptr()
    tol = TOLERANCE[dtype]
    for got, want in zip((dq, dk, dv), ref):
        assert rel_err(got, want) < tol
    for buf, buf0, want in ((gk, gk0, ref[3]), (gv, gv0, ref[4])):
        assert rel_err(buf[:, :, sl].double() - buf0[:, :, sl].double(), want) < tol   # prefill + gradient
        outside = torch.ones(buf.shape[2], dtype=torch.bool, device=buf.device)
        outside[sl] = False
        assert torch.equal(buf[:, :, outside], buf0[:, :, outside])
    # the launches read the slices and wrote the buffers in place
    assert {n for n, _, _ in seen} == {"_DQ_LAUNCH", "_KV_LAUNCH"}
    ptrs = [t.data_ptr() for t in (kd, vd, gk[:, :, sl], gv[:, :, sl])]
    dq_args = [a for n, a, _ in seen if n == "_DQ_LAUNCH"][0]
    assert [t.data_ptr() for t in dq_args] == ptrs
    if dtype == torch.float32:  # one rounding of prefill + fp32 gradient, as torch's addition of the plain call's
        plain = _bwd(q, k, v, do, kd.contiguous(), vd.contiguous(), out, lse, cfg)
        assert torch.equal(gk[:, :, sl], gk0[:, :, sl] + plain[3])
        assert torch.equal(gv[:, :, sl], gv0[:, :, sl] + plain[4])
        assert all(torch.equal(a, b) for a, b in zip((dq, dk, dv), plain[:3]))


@pytest.mark.parametrize("route", ["host", "device", "pointers", "one", "items"])
def test_every_route_reads_and_adds_in_place(monkeypatch, route):
    """The same call through each way the descriptor backward reaches the depth tiles: the result
    is the contiguous call's plus the prefill (fp32, bitwise), and the host-side descriptors (where
    built) carry the slices' real strides."""
    B, T, Hk, G, L, d = 1, 29, 2, 3, 5, 32
    q, k, v, do, kd, vd, gk0, gv0, sl, out, lse = _case(B, T, G * Hk, Hk, d, L, torch.float32, seed=9)
    gk, gv = gk0.clone(), gv0.clone()
    kw = dict(bwd_q_block_m=16, bwd_kv_block_m=16, bwd_kv_beside=0)
    if route == "one":
        kw["bwd_kv_beside"] = 2
    elif route == "items":
        kw["bwd_depth_items"] = 1
    elif route == "pointers":
        monkeypatch.setattr(kernel_mod, "aligned", lambda *t, **k_: False)
    if route == "device":
        monkeypatch.setattr(descriptors, "_HOST", [False])
    cfg = small_tma_config(**kw)
    plain = _bwd(q, k, v, do, kd.contiguous(), vd.contiguous(), out, lse, cfg)
    seen = _spy(monkeypatch)
    res = _bwd(q, k, v, do, kd, vd, out, lse, cfg, into=(gk[:, :, sl], gv[:, :, sl]))
    assert all(torch.equal(a, b) for a, b in zip(res[:3], plain[:3]))
    assert torch.equal(gk[:, :, sl], gk0[:, :, sl] + plain[3]) and torch.equal(gv[:, :, sl], gv0[:, :, sl] + plain[4])
    ptrs = [t.data_ptr() for t in (kd, vd, gk[:, :, sl], gv[:, :, sl])]
    depth_launch = {"one": "_ONE_LAUNCH", "items": "_KV_LAUNCH"}.get(route, "_DQ_LAUNCH")
    (args, strides), = [(a, s) for n, a, s in seen if n == depth_launch]
    assert [t.data_ptr() for t in args] == ptrs
    if route in ("host", "one"):
        assert strides == (kd.stride()[:3] + (1,),) * 2 + (gk.stride()[:3] + (1,),) * 2
    else:  # no host-side descriptors (depth items build theirs in the kernel, as the device route)
        assert strides in (None, (None,) * 4)


def test_detached_depth_leaves_the_buffer_alone():
    q, k, v, do, kd, vd, gk0, gv0, sl, out, lse = _case(1, 37, 4, 2, 32, 5, torch.float32, seed=4)
    gk, gv = gk0.clone(), gv0.clone()
    cfg = small_tma_config(bwd_kv_beside=0)
    res = _bwd(q, k, v, do, kd, vd, out, lse, cfg, into=(gk[:, :, sl], gv[:, :, sl]), depth_grad=False)
    plain = _bwd(q, k, v, do, kd.contiguous(), vd.contiguous(), out, lse, cfg, depth_grad=False)
    assert res[3] is None and res[4] is None
    assert torch.equal(gk, gk0) and torch.equal(gv, gv0)
    assert all(torch.equal(a, b) for a, b in zip(res[:3], plain[:3]))


def test_moda_attention_into_makes_no_copy(monkeypatch):
    """`moda_attention_into` under the descriptor backward: by default in the kernel, the depth
    slices never copied (no `contiguous` of a depth slice is asked for, every launch gets the slices'
    pointers), and the buffer holds prefill + gradient (fp64 reference)."""
    from moda_bench.kernels.moda.triton.accumulate import moda_attention_into
    B, T, Hk, G, L, d = 1, 21, 2, 2, 3, 32
    q, k, v, do, kd, vd, gk0, gv0, sl, _, _ = _case(B, T, G * Hk, Hk, d, L, torch.float32, seed=6)
    gk, gv = gk0.clone(), gv0.clone()
    kd, vd = kd.requires_grad_(True), vd.requires_grad_(True)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    copied = []
    real_contiguous = torch.Tensor.contiguous

    def contiguous(self, *a, **kw):
        if self.dim() == 5 and not self.is_contiguous():
            copied.append(self.shape)
        return real_contiguous(self, *a, **kw)
    monkeypatch.setattr(torch.Tensor, "contiguous", contiguous)
    seen = _spy(monkeypatch)
    out = moda_attention_into(*leaves, kd, vd, gk[:, :, sl], gv[:, :, sl], config=small_tma_config(bwd_kv_beside=0))
    out.backward(do)
    assert not copied
    ptrs = [t.data_ptr() for t in (kd, vd, gk[:, :, sl], gv[:, :, sl])]
    assert [[t.data_ptr() for t in a] for n, a, _ in seen if n == "_DQ_LAUNCH"] == [ptrs]
    ref = _reference(q, k, v, kd, vd, do, 1.0 / math.sqrt(d))
    assert kd.grad is None and vd.grad is None
    for t, r in zip(leaves, ref):
        assert rel_err(t.grad, r) < 1e-4
    assert rel_err(gk[:, :, sl].double() - gk0[:, :, sl].double(), ref[3]) < 1e-4
    assert rel_err(gv[:, :, sl].double() - gv0[:, :, sl].double(), ref[4]) < 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1000, 4099, 9001])  # one launch / two with host-side descriptors / device-side ones
def test_gpu_default_backward_adds_into_model_buffer(T):
    """Hopper's heuristic default backward at d = 64 (the descriptor one; tuned entries and d > 64
    resolve to pointer placements, so the heuristic's config is asked for) on a model's layout:
    slots [0, L) of (B, T, 48, Hk, d) bf16 buffers. dq, dk, dv equal the contiguous call's bitwise; the
    gradient buffer's slice holds prefill + the contiguous call's depth gradients to one bf16
    rounding (relative error <= 1e-2), twice after two calls (the kept launch and tensor maps);
    the slots after L untouched."""
    B, Hq, Hk, d, E, L = 1, 16, 4, 64, 48, 23
    g = torch.Generator(device="cuda").manual_seed(T)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device="cuda").to(torch.bfloat16)
    q, k, v, do = rnd(B, T, Hq, d), rnd(B, T, Hk, d), rnd(B, T, Hk, d), rnd(B, T, Hq, d)
    bk, bv = rnd(B, T, E, Hk, d), rnd(B, T, E, Hk, d)
    kd, vd = bk[:, :, :L], bv[:, :, :L]
    shape = check_inputs(q, k, v, kd, vd, need_cuda=True)
    cfg = default_config(shape, torch.bfloat16)
    assert cfg.bwd_depth == "tma"
    with torch.no_grad():
        out, lse = moda_attention(q, k, v, kd, vd, return_lse=True)
    plain = kernel_mod.moda_bwd(do, q, k, v, kd.contiguous(), vd.contiguous(), out, lse, d ** -0.5, shape, cfg)
    gk0, gv0 = (rnd(B, T, E, Hk, d) * p.float().pow(2).mean().sqrt().to(torch.bfloat16) for p in plain[3:])
    gk, gv = gk0.clone(), gv0.clone()
    for n in (1, 2):
        res = kernel_mod.moda_bwd(do, q, k, v, kd, vd, out, lse, d ** -0.5, shape, cfg,
                                  depth_grad_into=(gk[:, :, :L], gv[:, :, :L]))
        assert all(torch.equal(a, b) for a, b in zip(res[:3], plain[:3]))
        for buf, buf0, p in ((gk, gk0, plain[3]), (gv, gv0, plain[4])):
            assert rel_err(buf[:, :, :L].float() - buf0[:, :, :L].float(), n * p.float()) < 1e-2
            assert torch.equal(buf[:, :, L:], buf0[:, :, L:])
