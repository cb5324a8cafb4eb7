"""Depth K/V read in place (issue 59): a model keeps one depth buffer and hands each layer a slice;
`moda_attention`, `moda_decode` and `depth_attention`'s mix read that slice without a copy (the
pointer the kernel gets is the slice's own) and give exactly the contiguous call's results."""
from __future__ import annotations

import pytest
import torch
from helpers import random_inputs

from moda_bench.kernels.dattn import depth_attention
from moda_bench.kernels.decode import moda_decode
from moda_bench.kernels.moda import MoDAConfig, moda_attention
from moda_bench.kernels.moda.triton import interface as kernel_mod


def _slices(B, T, Hk, d, L, dtype, seed=3, lmax=7, first=2):
    """(kd, vd) as slices [first, first + L) of two (B, T, lmax, Hk, d) buffers, and the buffers."""
    g = torch.Generator().manual_seed(seed)
    bk, bv = (torch.randn(B, T, lmax, Hk, d, generator=g).to(dtype) for _ in range(2))
    return bk[:, :, first:first + L], bv[:, :, first:first + L], bk, bv


class _Spy:
    """Wraps a `CachedLaunch` (or any launch callable): records the data pointers of the argument
    positions `at` of every call."""

    def __init__(self, real, at):
        self.real, self.at, self.ptrs = real, at, []

    def __call__(self, key, grid, args, meta, *descs):
        self.ptrs.append(tuple(args[i].data_ptr() for i in self.at))
        return self.real(key, grid, args, meta, *descs)


def _run(q, k, v, kd, vd, do, **kw):
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    kd, vd = kd.detach().requires_grad_(True), vd.detach().requires_grad_(True)  # views stay views
    out, lse = moda_attention(*leaves, kd, vd, return_lse=True, **kw)
    out.backward(do)
    grads = [x.grad for x in (*leaves, kd, vd)]
    return out, lse, grads


@pytest.mark.parametrize("placement", ["fused", "split", "tma"])
@pytest.mark.parametrize("depth_grad", [True, False])
def test_moda_reads_depth_slice_in_place(monkeypatch, placement, depth_grad):
    """Every pointer launch gets the slice's data pointer for KD and VD (forward and backward), the
    depth gradients are contiguous of the slice's shape, and out, lse and all gradients equal the
    contiguous call's bit for bit. "tma": the descriptor forward takes contiguous depth only, so the
    slice takes the pointer kernel in place (fp32 rounding apart from the descriptor kernel's result,
    checked to 1e-5), and the descriptor backward reads it in place too (its launch that reads the
    depth, `_DQ_LAUNCH` or `_ONE_LAUNCH`, gets the slice's pointers)."""
    q, k, v, _, _, do = random_inputs(1, 21, 4, 2, 16, 0, torch.float32, seed=5)
    kd, vd, _, _ = _slices(1, 21, 2, 16, 3, torch.float32)
    assert not kd.is_contiguous()
    cfg = MoDAConfig(block_m=16, block_n=16, depth_block_m=16, bwd_q_block_m=16, bwd_kv_block_m=16,
                     bwd_kv_block_n=16, block_l=16, bwd_block_l=16, fwd_depth=placement, bwd_depth=placement)
    spies = {name: _Spy(getattr(kernel_mod, name), (3, 4)) for name in ("_FWD_PTR", "_BWD_Q_PTR", "_BWD_KV_PTR")}
    for name, spy in spies.items():
        monkeypatch.setattr(kernel_mod, name, spy)
    from moda_bench.kernels.moda.triton import bwd_tma
    tma_spies = [_Spy(getattr(bwd_tma, name), (3, 4)) for name in ("_DQ_LAUNCH", "_ONE_LAUNCH")]
    for name, spy in zip(("_DQ_LAUNCH", "_ONE_LAUNCH"), tma_spies):
        monkeypatch.setattr(bwd_tma, name, spy)
    got = _run(q, k, v, kd, vd, do, config=cfg, depth_grad=depth_grad)
    want = _run(q, k, v, kd.contiguous(), vd.contiguous(), do, config=cfg, depth_grad=depth_grad)
    n_strided = len(spies["_FWD_PTR"].ptrs) // 2  # the strided call's launches came first
    assert spies["_FWD_PTR"].ptrs[:n_strided] == [(kd.data_ptr(), vd.data_ptr())] * n_strided
    if placement != "tma":
        for name in ("_BWD_Q_PTR", "_BWD_KV_PTR"):
            ptrs = spies[name].ptrs
            assert ptrs[:len(ptrs) // 2] == [(kd.data_ptr(), vd.data_ptr())] * (len(ptrs) // 2)
    else:  # one descriptor-backward launch reads the depth a call: the strided call's came first
        ptrs = [p for spy in tma_spies for p in spy.ptrs]
        assert len(ptrs) == 2 and ptrs[0] == (kd.data_ptr(), vd.data_ptr())
    same = torch.equal if placement != "tma" else (lambda a, b: torch.allclose(a, b, rtol=1e-5, atol=1e-5))
    assert same(got[0], want[0]) and same(got[1], want[1])
    for i, (a, b) in enumerate(zip(got[2], want[2])):
        assert (a is None) == (b is None) == (i >= 3 and not depth_grad)
        if a is not None:
            assert a.is_contiguous() and same(a, b)
    if depth_grad:
        assert got[2][3].shape == kd.shape


def test_moda_mismatched_depth_strides_still_right():
    """k_depth and v_depth with different strides (one a slice, one contiguous): both are copied
    (`depth_views`), the result equals the contiguous call's."""
    q, k, v, _, _, _ = random_inputs(1, 9, 2, 2, 16, 0, torch.float32, seed=2)
    kd, vd, _, _ = _slices(1, 9, 2, 16, 2, torch.float32)
    got = moda_attention(q, k, v, kd, vd.contiguous())
    assert torch.equal(got, moda_attention(q, k, v, kd.contiguous(), vd.contiguous()))


def test_decode_reads_depth_slice_in_place(monkeypatch):
    """`moda_decode` hands the split kernel the slice itself (args 3, 4) and equals the contiguous call."""
    import moda_bench.kernels.decode.interface as dmod
    g = torch.Generator().manual_seed(1)
    q, kc, vc = (torch.randn(2, 1, 4, 16, generator=g), torch.randn(2, 11, 2, 16, generator=g),
                 torch.randn(2, 11, 2, 16, generator=g))
    kd, vd, _, _ = _slices(2, 1, 2, 16, 3, torch.float32)
    spy = _Spy(dmod._SPLIT_LAUNCH, (3, 4))
    monkeypatch.setattr(dmod, "_SPLIT_LAUNCH", spy)
    got = moda_decode(q, kc, vc, kd, vd, num_splits=2)
    assert spy.ptrs[0] == (kd.data_ptr(), vd.data_ptr())
    assert torch.equal(got, moda_decode(q, kc, vc, kd.contiguous(), vd.contiguous(), num_splits=2))


def test_depth_attention_mix_reads_sources_in_place(monkeypatch):
    """The fused mix's forward and backward launches get the source slices themselves (args 3, 4)."""
    import moda_bench.kernels.dattn.mix_triton as mmod
    from moda_bench.kernels.dattn import torch_causal_attention
    q, k, v, _, _, do = random_inputs(1, 7, 4, 2, 16, 0, torch.float32, seed=4)
    ks, vs, _, _ = _slices(1, 7, 2, 16, 2, torch.float32)
    spies = {name: _Spy(getattr(mmod, name), (3, 4)) for name in ("_FWD_LAUNCH", "_BWD_LAUNCH")}
    for name, spy in spies.items():
        monkeypatch.setattr(mmod, name, spy)
    outs = []
    for src in ((ks, vs), (ks.contiguous(), vs.contiguous())):
        leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
        srcs = [s.detach().requires_grad_(True) for s in src]
        out = depth_attention(*leaves, *srcs, attention=torch_causal_attention)
        out.backward(do)
        outs.append([out] + [x.grad for x in (*leaves, *srcs)])
    for spy in spies.values():
        assert spy.ptrs[0] == (ks.data_ptr(), vs.data_ptr())
    for a, b in zip(*outs):
        assert torch.equal(a, b)
