"""Depth-Attention's two launches (`mix_fwd_kernel`, `mix_bwd_kernel`) through `CachedLaunch`
(moda_bench.kernels.dattn.mix_triton's `_FWD_LAUNCH`, `_BWD_LAUNCH`, keyed by `launch_key`).

CPU: the key is None for a misaligned pointer, else stable and hashable, and it changes with
every stride, dtype, integer argument and constexpr (S = 0's stand-in sources included); the
launches go through the two CachedLaunch objects (under the interpreter they take Triton's path).
GPU (`-m gpu`): forward + backward through `depth_attention` (autograd-composed and chained) and
the S = 0 launches, with the cache and with Triton's own path: bitwise the same, and the second
call of each case launches both kernels from the cache.
"""
from __future__ import annotations

import pytest
import torch
from helpers import cached_against_tritons, random_inputs

from moda_bench.kernels import dattn
from moda_bench.kernels.dattn import mix_triton as mk


def _fwd_key(q, k, v, ks, vs, shape=None, **kw):
    shape = shape or dattn.check_dattn_inputs(q, k, v, ks, vs)
    vm = torch.empty((shape.B, shape.T, shape.Hk, shape.d), dtype=v.dtype)
    lse = torch.empty(shape.B * shape.T * shape.Hk)
    return mk.fwd_launch(q, k, v, ks, vs, vm, lse, 0.25, shape, **kw)[0]


def _bwd_key(q, k, v, ks, vs, dq=None, dk=None, accum=False, **kw):
    shape = dattn.check_dattn_inputs(q, k, v, ks, vs)
    dvm, lse = torch.empty_like(v), torch.empty(shape.B * shape.T * shape.Hk)
    dq = torch.empty_like(q) if dq is None else dq
    dk = torch.empty_like(k) if dk is None else dk
    dks = None if ks is None else torch.empty_like(ks)
    dvs = None if vs is None else torch.empty_like(vs)
    return mk.bwd_launch(dvm, q, k, v, ks, vs, lse, dq, dk, torch.empty_like(v), dks, dvs, 0.25, shape,
                         accum=accum, **kw)[0]


def _inputs(S, dtype=torch.float32, T=13):
    return tuple(x.detach() if x is not None else None for x in random_inputs(1, T, 4, 2, 16, S, dtype, seed=S)[:5])


@pytest.mark.parametrize("S", [0, 3])
def test_launch_key_alignment_stability_and_changes(S):
    """None where any pointer is off 16 bytes (a view offset by one element), else equal keys
    for equal launches, hashable; a stride, a dtype, T, the tile, num_warps, accumulate mode
    each give another key."""
    q, k, v, ks, vs = _inputs(S)
    key = _fwd_key(q, k, v, ks, vs)
    assert key is not None and hash(key) == hash(_fwd_key(*_inputs(S))) and key == _fwd_key(*_inputs(S))
    bkey = _bwd_key(q, k, v, ks, vs)
    assert bkey is not None and hash(bkey) == hash(_bwd_key(*_inputs(S))) and bkey == _bwd_key(*_inputs(S))

    off = torch.empty(q.numel() + 1)[1:].view(q.shape).copy_(q)   # 4 bytes past an aligned base
    assert off.data_ptr() % 16 and off.stride() == q.stride()
    assert _fwd_key(off, k, v, ks, vs) is None and _bwd_key(off, k, v, ks, vs) is None
    assert _bwd_key(q, k, v, ks, vs, dq=torch.empty(q.numel() + 4)[1:-3].view(q.shape), accum=True) is None
    if S:
        ks_off = torch.empty(ks.numel() + 1)[1:].view(ks.shape).copy_(ks)
        assert _fwd_key(q, k, v, ks_off, vs) is None

    # a stride: q as a slice of a wider (aligned) tensor, same shape and values
    wide = torch.zeros(q.shape[:2] + (q.shape[2] + 4, q.shape[3]))
    qs = wide[:, :, :q.shape[2]].copy_(q)
    assert qs.stride() != q.stride() and qs.data_ptr() % 16 == 0
    assert _fwd_key(qs, k, v, ks, vs) not in (None, key) and _bwd_key(qs, k, v, ks, vs) not in (None, bkey)
    assert _bwd_key(q, k, v, ks, vs, dq=wide[:, :, :q.shape[2]], accum=True) not in (
        None, bkey, _bwd_key(q, k, v, ks, vs, accum=True))
    # a dtype
    half = _inputs(S, torch.float16)
    assert _fwd_key(*half) not in (None, key) and _bwd_key(*half) not in (None, bkey)
    # an integer argument (T), a constexpr, a launch option, the accumulate mode
    assert _fwd_key(*_inputs(S, T=14)) != key and _bwd_key(*_inputs(S, T=14)) != bkey
    assert _fwd_key(q, k, v, ks, vs, block_r=16) != key and _fwd_key(q, k, v, ks, vs, num_warps=2) != key
    assert _bwd_key(q, k, v, ks, vs, accum=True) != bkey


def test_launch_key_no_sources_differs_from_one_source():
    """S = 0's launches (k and v standing in for the sources) and S = 1's have other keys: S is an
    integer argument of both kernels and SP differs from nothing but S."""
    q, k, v, _, _ = _inputs(0)
    ks, vs = k.unsqueeze(2).clone(), v.unsqueeze(2).clone()
    assert _fwd_key(q, k, v, None, None) != _fwd_key(q, k, v, ks, vs)
    assert _bwd_key(q, k, v, None, None) != _bwd_key(q, k, v, ks, vs)


def test_launch_key_is_the_arguments_specialisation():
    """`launch_key` holds the tensor dtypes, the integer arguments and the constexprs as given."""
    a, b = torch.zeros(4), torch.zeros(4, dtype=torch.bfloat16)
    assert mk.launch_key((a, b), (1, 16, 17), (4, True)) == ((torch.float32, torch.bfloat16), (1, 16, 17), (4, True))
    assert mk.launch_key((a, torch.zeros(8, dtype=torch.bfloat16)[1:]), (1,), ()) is None


def test_mix_launches_go_through_cached_launch(monkeypatch):
    """mix_fwd and mix_bwd hand their launches to `_FWD_LAUNCH` / `_BWD_LAUNCH` with a key (an
    aligned launch) and the kernel's arguments in signature order; under the interpreter those
    take Triton's path and keep nothing. S = 0 too (mix_fwd / mix_bwd launch it)."""
    seen = []
    for name in ("_FWD_LAUNCH", "_BWD_LAUNCH"):
        real = getattr(mk, name)

        def spy(key, grid, args, meta, real=real):
            seen.append((real.fn, key, len(args) + len(meta()) - 1))   # num_warps is no parameter
            real(key, grid, args, meta)

        monkeypatch.setattr(mk, name, spy)
    for S in (0, 2):
        q, k, v, ks, vs = _inputs(S)
        shape = dattn.check_dattn_inputs(q, k, v, ks, vs)
        vm, lse = mk.mix_fwd(q, k, v, ks, vs, 0.25, shape)
        mk.mix_bwd(torch.randn_like(vm), q, k, v, ks, vs, lse, 0.25, shape)
    assert [s[0] for s in seen] == [mk.mix_fwd_kernel, mk.mix_bwd_kernel] * 2
    assert all(key is not None for _, key, _ in seen)
    assert all(n == len(fn.arg_names) for fn, _, n in seen)


# ------------------------------------------------------------------ GPU: bitwise Triton's path
def _math_attention(q, k, v):
    """Causal GQA attention from plain matmuls (deterministic on a GPU, unlike some SDPA
    backwards), autograd-enabled."""
    G = q.shape[2] // k.shape[2]
    qh = q.float().transpose(1, 2)
    kh, vh = (x.float().repeat_interleave(G, dim=2).transpose(1, 2) for x in (k, v))
    s = torch.matmul(qh, kh.transpose(-1, -2)) / q.shape[-1] ** 0.5
    T = q.shape[1]
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    return torch.matmul(torch.softmax(s, -1), vh).transpose(1, 2).to(q.dtype)


def _step_attention(ins, cot, attention):
    """depth_attention fwd+bwd: out, v_mixed and the gradients of the inputs."""
    out, vm = dattn.depth_attention(*ins, return_mixed=True, attention=attention)
    grads = torch.autograd.grad((out, vm), [x for x in ins if x is not None], cot)
    return [out, vm, *grads]


def _step_direct(ins, cot, accum):
    """mix_fwd + mix_bwd (S = 0 here: depth_attention launches nothing then); with accum the
    backward adds into copies of fixed dq, dk buffers (the chained node's mode)."""
    q, k, v, ks, vs = (x.detach() if x is not None else None for x in ins)
    shape = dattn.check_dattn_inputs(q, k, v, ks, vs)
    vm, lse = mk.mix_fwd(q, k, v, ks, vs, 0.25, shape)
    into = dict(dq_into=cot[0].new_full(q.shape, 0.5), dk_into=cot[0].new_full(k.shape, -0.5)) if accum else {}
    grads = mk.mix_bwd(cot[1], q, k, v, ks, vs, lse, 0.25, shape, **into)
    return [vm, lse, *(g for g in grads if g is not None)]


GPU_CASES = [(1, 333, 4, 2, 64, 5), (2, 77, 1, 3, 32, 1), (1, 129, 8, 1, 128, 16), (1, 1001, 2, 2, 16, 0)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_gpu_cached_mix_launches_give_tritons_results(monkeypatch, dtype):
    """At odd sizes (rows not a multiple of the block; S = 0, 1, 5, 16; d 16..128; G 1..8), the
    mix's forward and backward repeat from the cache after their first call, with out, v_mixed
    and all gradients bitwise those of Triton's own path: through depth_attention composed by
    autograd (a plain-matmul attention) and chained (TORCH_BACKEND: the accumulating backward),
    and through mix_fwd / mix_bwd at S = 0 (stand-in sources), writing and accumulating. A
    misaligned q takes Triton's path at every call (no cache hit), with the same results."""
    from moda_bench.kernels.moda.fa4.merge import TORCH_BACKEND
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    for B, T, G, Hk, d, S in GPU_CASES:
        ins = random_inputs(B, T, G * Hk, Hk, d, S, dtype, seed=T + S)
        do = ins[-1]
        ins = ins[:5]
        dvm = torch.randn(B, T, Hk, d, generator=torch.Generator().manual_seed(S)).to(do.device, dtype)
        steps = {"accum": lambda: _step_direct(ins, (do, dvm), True),
                 "write": lambda: _step_direct(ins, (do, dvm), False)} if S == 0 else {
            "composed": lambda: _step_attention(ins, (do, dvm), _math_attention),
            "chained": lambda: _step_attention(ins, (do, dvm), TORCH_BACKEND)}
        for name, step in steps.items():
            cached, same = cached_against_tritons(monkeypatch, step)
            assert cached == 2, (name, B, T, G, Hk, d, S, cached)   # forward and backward
            assert same, (name, B, T, G, Hk, d, S)
    assert mk._FWD_LAUNCH.entries >= 1 and mk._BWD_LAUNCH.entries >= 1
    q, k, v, _, _ = (x.detach() for x in random_inputs(1, 77, 4, 2, 64, 1, dtype, seed=1)[:5])
    off = torch.empty(q.numel() + 1, device=q.device, dtype=dtype)[1:].view(q.shape).copy_(q)
    cached, same = cached_against_tritons(monkeypatch, lambda: _step_direct((off, k, v, None, None), (q, v), False))
    assert cached == 0 and same
