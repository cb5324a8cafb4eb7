"""Depth-Attention (moda_bench.kernels.dattn) against its fp64 dense reference.

CPU: the fused Triton mix runs under TRITON_INTERPRET=1 (conftest.py); the sequence attention is
the plain-torch `torch_causal_attention` passed as `attention=` (FA4 needs CUDA), except one case
with the default backend, which on a CPU is our Triton kernel at L = 0 (it runs under the
interpreter). Every check compares out, v_mixed and the gradients of all five inputs, with
cotangents on both out and v_mixed, as ||err|| / ||ref|| (helpers.rel_err): fp32 < 1e-4,
fp16 < 5e-3, bf16 < 2e-2 (helpers.TOLERANCE), for both mixes ("triton" and "torch").
GPU (`-m gpu`): real sizes in bf16 with the default backend (FA4 where installed) against an
fp32 reference, and the Triton mix alone against the fp64 mix reference and the torch mix.
"""
import itertools

import pytest
import torch
from helpers import TOLERANCE, random_inputs, rel_err

from moda_bench.kernels import dattn
from moda_bench.kernels.dattn import (
    MAX_SOURCES,
    depth_attention,
    depth_attention_reference,
    depth_mix,
    depth_mix_torch,
    mix_bytes,
    mix_reference,
    sequence_backend,
    torch_causal_attention,
)
from moda_bench.kernels.dattn.attention import backend_for
from moda_bench.kernels.dattn.mix_triton import mix_bwd, mix_fwd

MIXERS = {"triton": depth_mix, "torch": depth_mix_torch}


def check_case(mix, B, T, G, Hk, d, S, dtype, seed=0, tol=None, ref_dtype=torch.float64,
               attention=torch_causal_attention, **kw):
    """depth_attention fwd+bwd vs depth_attention_reference: out, v_mixed and every gradient.
    Returns the dict of relative errors (asserted < tol)."""
    tol = tol or TOLERANCE[dtype]
    q, k, v, ks, vs, do = random_inputs(B, T, G * Hk, Hk, d, S, dtype, seed)
    dvm = torch.randn(B, T, Hk, d, generator=torch.Generator().manual_seed(seed + 1)).to(q.device, dtype)
    inputs = [x for x in (q, k, v, ks, vs) if x is not None]
    out, vm = depth_attention(q, k, v, ks, vs, return_mixed=True, mix=mix, attention=attention, **kw)
    assert out.shape == q.shape and out.dtype == dtype
    assert vm.shape == v.shape and vm.dtype == dtype
    grads = torch.autograd.grad((out, vm), inputs, (do, dvm))
    ref_out, ref_vm = depth_attention_reference(q, k, v, ks, vs, return_mixed=True, compute_dtype=ref_dtype,
                                                out_dtype=ref_dtype, scale=kw.get("scale"))
    ref_grads = torch.autograd.grad((ref_out, ref_vm), inputs, (do.to(ref_dtype), dvm.to(ref_dtype)))
    errs = {"out": rel_err(out, ref_out), "v_mixed": rel_err(vm, ref_vm)}
    for name, g, r in zip(["q", "k", "v", "k_src", "v_src"], grads, ref_grads):
        assert g.shape == r.shape and g.dtype == dtype, name
        errs["d" + name] = rel_err(g, r)
    bad = {n: e for n, e in errs.items() if not e < tol}
    assert not bad, f"errors above {tol:g}: {bad} (all: {errs})"
    return errs


GRID = list(itertools.product(["triton", "torch"], [1, 7, 33], [1, 2, 4, 8], [0, 1, 5]))


@pytest.mark.parametrize("mix,T,G,S", GRID, ids=[f"{m}-T{t}-G{g}-S{s}" for m, t, g, s in GRID])
def test_grid_fp32(mix, T, G, S):
    """Odd T, every G and S of the issue, d 16 or 32: B*T*Hk from 1 to 132 rows, one or several
    programs a launch, the last one partial."""
    B = 2 if T <= 7 or G == 1 else 1
    Hk = 2 if G <= 4 else 1
    d = 16 if (T + G + S) % 2 else 32
    check_case(mix, B, T, G, Hk, d, S, torch.float32, seed=T * 100 + G * 10 + S, tol=1e-4)


@pytest.mark.parametrize("mix", ["triton", "torch"])
@pytest.mark.parametrize("dtype,B,T,G,S", [(torch.float32, 2, 45, 4, 5), (torch.bfloat16, 1, 33, 4, 5),
                                           (torch.float16, 2, 19, 2, 3)], ids=["fp32", "bf16", "fp16"])
def test_d64_dtypes(mix, dtype, B, T, G, S):
    check_case(mix, B, T, G, 2, 64, S, dtype, seed=T + S)


def test_d128_and_max_sources():
    """d = 128 (smallest row block, 16 rows) with the most sources allowed (S = 64, SP = 64)."""
    check_case("triton", 1, 9, 2, 2, 128, 3, torch.float32, seed=4)
    check_case("triton", 1, 3, 2, 1, 16, MAX_SOURCES, torch.float32, seed=5)


def test_default_backend_is_our_triton_kernel_on_cpu():
    """attention=None on a CPU: FA4 cannot run, so the Triton kernel at L = 0 (interpreter)."""
    from moda_bench.kernels.moda import moda_attention
    assert sequence_backend("cpu") == (moda_attention, "moda-triton")
    check_case("triton", 1, 17, 2, 2, 32, 2, torch.float32, seed=9, attention=None)


def test_sequence_backend_choice(monkeypatch):
    """FA4 when it can run and the dtype is fp16/bf16; the Triton kernel otherwise."""
    from moda_bench.kernels.moda import moda_attention
    from moda_bench.kernels.moda.fa4 import merge as fa4
    backend_for.cache_clear()
    monkeypatch.setattr(fa4, "fa4_unavailable", lambda device=None: None)
    try:
        assert sequence_backend("cpu", torch.bfloat16) == (fa4.fa4_attention, "fa4")
        assert sequence_backend("cpu") == (fa4.fa4_attention, "fa4")
        assert sequence_backend("cpu", torch.float32) == (moda_attention, "moda-triton")
    finally:
        backend_for.cache_clear()


def test_mix_alone_against_reference():
    """depth_mix and depth_mix_torch vs mix_reference, value and gradients, non-default scale."""
    q, k, v, ks, vs, _ = random_inputs(2, 11, 8, 2, 32, 4, torch.float32, seed=3)
    dvm = torch.randn(2, 11, 2, 32)
    ref = mix_reference(q, k, v, ks, vs, scale=0.7, out_dtype=torch.float64)
    ref_grads = torch.autograd.grad(ref, (q, k, v, ks, vs), dvm.double())
    for name, fn in MIXERS.items():
        vm = fn(q, k, v, ks, vs, scale=0.7)
        grads = torch.autograd.grad(vm, (q, k, v, ks, vs), dvm)
        errs = [rel_err(vm, ref)] + [rel_err(g, r) for g, r in zip(grads, ref_grads)]
        assert max(errs) < 1e-5, (name, errs)


@pytest.mark.parametrize("S", [0, 3])
def test_launches_with_small_tiles(S):
    """mix_fwd / mix_bwd with 16-row tiles (5 programs for 70 rows, the last partial) vs the
    reference's value and gradients; S = 0 through the kernels too (v_mixed = v, dv = dv_mixed,
    no dq or dk share), which `depth_mix` never launches."""
    B, T, Hk, G, d = 1, 35, 2, 4, 16
    q, k, v, ks, vs, _ = random_inputs(B, T, G * Hk, Hk, d, S, torch.float32, seed=S)
    shape = dattn.check_dattn_inputs(q, k, v, ks, vs)
    dvm = torch.randn(B, T, Hk, d)
    vm, lse = mix_fwd(q, k, v, ks, vs, 0.25, shape, block_r=16, num_warps=2)
    grads = mix_bwd(dvm, q, k, v, ks, vs, lse, 0.25, shape, block_r=16, num_warps=2)
    inputs = [x for x in (q, k, v, ks, vs) if x is not None]
    ref = mix_reference(q, k, v, ks, vs, scale=0.25, out_dtype=torch.float64)
    ref_grads = torch.autograd.grad(ref, inputs, dvm.double(), allow_unused=True)
    assert rel_err(vm, ref) < 1e-6
    for g, r in zip(grads, ref_grads):
        assert rel_err(g, torch.zeros_like(g) if r is None else r) < 1e-5
    assert grads[3:] == (None, None) if S == 0 else all(g is not None for g in grads)


@pytest.mark.parametrize("mix", ["triton", "torch"])
def test_scale_is_the_depth_softmax_scale(mix):
    check_case(mix, 1, 13, 2, 2, 32, 3, torch.float32, seed=6, scale=0.3)
    q, k, v, ks, vs, _ = random_inputs(1, 13, 4, 2, 32, 3, torch.float32, seed=6)
    a = depth_attention(q, k, v, ks, vs, mix=mix, attention=torch_causal_attention, scale=0.3)
    b = depth_attention(q, k, v, ks, vs, mix=mix, attention=torch_causal_attention)
    assert rel_err(a, b) > 1e-3  # it does change the answer


@pytest.mark.parametrize("mix", ["triton", "torch"])
def test_no_sources_is_causal_attention(mix):
    """S = 0 (None or an empty source axis): v_mixed is v itself and out is causal GQA attention."""
    q, k, v, ks, vs, _ = random_inputs(1, 9, 4, 2, 32, 1, torch.float32, seed=2)
    ref = torch_causal_attention(q, k, v)
    for src in [(None, None), (ks[:, :, :0], vs[:, :, :0])]:
        out, vm = depth_attention(q, k, v, *src, return_mixed=True, mix=mix, attention=torch_causal_attention)
        assert vm is v
        assert rel_err(out, ref) < 1e-6
        assert MIXERS[mix](q, k, v, *src) is v


@pytest.mark.parametrize("mix", ["triton", "torch"])
def test_under_no_grad(mix):
    """The benchmark's fwd pass runs under no_grad: same answer, nothing requires grad."""
    q, k, v, ks, vs, _ = random_inputs(1, 11, 4, 2, 16, 2, torch.float32, seed=4)
    with torch.no_grad():
        out, vm = depth_attention(q, k, v, ks, vs, return_mixed=True, mix=mix, attention=torch_causal_attention)
    assert not (out.requires_grad or vm.requires_grad)
    ref, ref_vm = depth_attention_reference(q, k, v, ks, vs, return_mixed=True, out_dtype=torch.float64)
    assert rel_err(out, ref) < 1e-5 and rel_err(vm, ref_vm) < 1e-5


def test_strided_inputs():
    """q, k, v as slices of one fused projection, sources as a permuted view, and a non-unit
    last stride (copied): the same answer as contiguous inputs."""
    B, T, Hk, G, d, S = 2, 13, 2, 2, 32, 3
    g = torch.Generator().manual_seed(8)
    qkv = torch.randn(B, T, Hk * G + 2 * Hk, d, generator=g)
    q, k, v = qkv[:, :, :Hk * G], qkv[:, :, Hk * G:Hk * G + Hk], qkv[:, :, Hk * G + Hk:]
    src = torch.randn(2, S, B, T, Hk, d, generator=g).permute(0, 2, 3, 1, 4, 5)  # k_src, v_src
    ks, vs = src[0], src[1]
    wide = torch.randn(B, T, Hk, 2 * d, generator=g)
    v2 = wide[..., ::2]
    assert not (q.is_contiguous() or ks.is_contiguous() or v2.stride(-1) == 1)
    for args in [(q, k, v, ks, vs), (q, k, v2, ks, vs)]:
        args = [a.requires_grad_(True) if a.is_leaf else a for a in args]
        dense = [a.detach().contiguous().requires_grad_(True) for a in args]
        vm, vm_ref = depth_mix(*args), depth_mix(*dense)
        dvm = torch.randn_like(vm)
        leaves = [a for a in args if a.is_leaf]
        grads = torch.autograd.grad(vm, leaves, dvm)
        ref_grads = torch.autograd.grad(vm_ref, [d_ for a, d_ in zip(args, dense) if a.is_leaf], dvm)
        assert rel_err(vm, vm_ref) < 1e-6
        assert all(rel_err(a, b) < 1e-6 for a, b in zip(grads, ref_grads))


def test_strided_qkv_gradients_flow():
    """Views of a fused projection: the gradient reaches the projection through the views."""
    qkv = torch.randn(1, 7, 8, 16, requires_grad=True)
    q, k, v = qkv[:, :, :4], qkv[:, :, 4:6], qkv[:, :, 6:]
    ks, vs = torch.randn(1, 7, 2, 2, 16), torch.randn(1, 7, 2, 2, 16)
    (gk,) = torch.autograd.grad(depth_mix(q, k, v, ks, vs).sum(), qkv)
    (gt,) = torch.autograd.grad(depth_mix_torch(q, k, v, ks, vs).sum(), qkv)
    assert rel_err(gk, gt) < 1e-5


def test_prefix_of_the_reference_is_exact():
    """The benchmark's accuracy check slices batch 0, positions < n: the reference of the prefix
    is the prefix of the reference (the mix is per position, the attention causal)."""
    q, k, v, ks, vs, _ = random_inputs(2, 40, 4, 2, 16, 3, torch.float32, seed=1)
    full, full_vm = depth_attention_reference(q, k, v, ks, vs, return_mixed=True, out_dtype=torch.float64)
    n = 23
    pre, pre_vm = depth_attention_reference(*(x[:1, :n] for x in (q, k, v, ks, vs)), return_mixed=True,
                                            out_dtype=torch.float64)
    assert rel_err(pre, full[:1, :n]) < 1e-12 and rel_err(pre_vm, full_vm[:1, :n]) < 1e-12


def test_the_check_catches_a_wrong_gqa_rule(monkeypatch):
    """The comparison can fail: a mix that scores with the group's first query head instead of
    the group mean is caught (G > 1), while at G = 1 the two rules agree."""

    def first_head_mix(q, k, v, k_src=None, v_src=None, scale=None):
        G = q.shape[2] // k.shape[2]
        return depth_mix_torch(q[:, :, ::G].repeat_interleave(G, dim=2), k, v, k_src, v_src, scale=scale)

    monkeypatch.setattr(dattn.attention, "depth_mix_torch", first_head_mix)
    with pytest.raises(AssertionError, match="errors above"):
        check_case("torch", 1, 7, 4, 2, 16, 3, torch.float32, seed=1)
    check_case("torch", 1, 7, 1, 2, 16, 3, torch.float32, seed=1)


def test_mix_bytes():
    B, T, Hq, Hk, S, d = 2, 1000, 32, 8, 5, 64
    unit = B * T * d * 2
    assert mix_bytes(B, T, Hq, Hk, S, d, 2, "fwd") == unit * (Hq + Hk * (3 + 2 * S))
    assert mix_bytes(B, T, Hq, Hk, S, d, 2, "bwd") == unit * (2 * Hq + Hk * (5 + 4 * S))
    assert mix_bytes(B, T, Hq, Hk, S, d, 2, "fwdbwd") == (mix_bytes(B, T, Hq, Hk, S, d, 2, "fwd")
                                                          + mix_bytes(B, T, Hq, Hk, S, d, 2, "bwd"))
    assert mix_bytes(B, T, Hq, Hk, 0, d, 2, "fwdbwd") == 0
    with pytest.raises(ValueError, match="pass_ must be one of"):
        mix_bytes(B, T, Hq, Hk, S, d, 2, "decode")


# ------------------------------------------------------------------ errors
def _good(S=2):
    return random_inputs(1, 8, 4, 2, 32, S, torch.float32)[:5]


BAD = [
    (lambda a: ("q",) + a[1:], TypeError, "q must be a torch.Tensor"),
    (lambda a: (a[0][0],) + a[1:], ValueError,
     r"q must have rank 4 with layout \(B, T, Hq, d\), got shape \(8, 4, 32\)"),
    (lambda a: a[:3] + (a[3][0], a[4]), ValueError, r"k_src must have rank 5 .* got shape \(8, 2, 2, 32\)"),
    (lambda a: (a[0][:, :, :3],) + a[1:], ValueError, r"Hq=3 must be a multiple of k heads Hk=2"),
    (lambda a: (a[0], a[1][:, :5], a[2][:, :5]) + a[3:], ValueError, r"k must have shape \(B=1, T=8, Hk, d=32\)"),
    (lambda a: (a[0], a[1], a[2][:, :, :1]) + a[3:], ValueError, r"v must have the shape of k \(1, 8, 2, 32\)"),
    (lambda a: a[:3] + (a[3][:, :5], a[4][:, :5]), ValueError, r"k_src must have shape \(B=1, T=8, S, Hk=2, d=32\)"),
    (lambda a: a[:3] + (a[3][:, :, :, :1], a[4][:, :, :, :1]), ValueError,
     r"k_src must have shape .* got \(1, 8, 2, 1"),
    (lambda a: a[:4] + (a[4][:, :, :1],), ValueError, r"v_src has S=1 sources but k_src has S=2"),
    (lambda a: a[:4] + (a[4][..., :16],), ValueError, r"v_src must have the shape of k_src"),
    (lambda a: a[:4] + (None,), ValueError, "k_src and v_src must both be given"),
    (lambda a: a[:3] + (None, a[4]), ValueError, "k_src and v_src must both be given"),
    (lambda a: (a[0].double(),) + a[1:], TypeError, "q has dtype torch.float64"),
    (lambda a: (a[0], a[1].half()) + a[2:], TypeError, "k has dtype torch.float16 but q has torch.float32"),
    (lambda a: tuple(x[..., :24] for x in a), ValueError, r"head dim d=24"),
    (lambda a: a[:3] + tuple(x.expand(-1, -1, MAX_SOURCES + 1, -1, -1) for x in (a[3][:, :, :1], a[4][:, :, :1])),
     ValueError, f"S={MAX_SOURCES + 1} source layers; at most {MAX_SOURCES}"),
    (lambda a: (a[0][:, :0],) + a[1:], ValueError, r"must have B, T, Hq, d >= 1"),
]


@pytest.mark.parametrize("entry", ["triton", "torch", "depth_mix", "depth_mix_torch", "reference"])
@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_input_errors(entry, case):
    mutate, exc, words = BAD[case]
    args = mutate(_good())
    fn = {"triton": lambda *a: depth_attention(*a, attention=torch_causal_attention),
          "torch": lambda *a: depth_attention(*a, mix="torch", attention=torch_causal_attention),
          "depth_mix": depth_mix, "depth_mix_torch": depth_mix_torch, "reference": mix_reference}[entry]
    if entry == "reference" and ("float64" in words or "head dim" in words):
        pytest.skip("the reference takes float64 and any head dim (test_reference_takes_float64_any_d)")
    with pytest.raises(exc, match=words):
        fn(*args)


def test_reference_takes_float64_any_d():
    q, k, v, ks, vs = (x.detach().double()[..., :24] for x in _good())
    assert depth_attention_reference(q, k, v, ks, vs).dtype == torch.float64


def test_bad_options():
    args = _good()
    with pytest.raises(ValueError, match="mix must be one of triton, torch, got 'cuda'"):
        depth_attention(*args, mix="cuda")
    with pytest.raises(TypeError, match="attention must be a callable"):
        depth_attention(*args, attention="fa4")


def test_cpu_tensors_rejected_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v, ks, vs = (x.cpu() for x in _good())
    with pytest.raises(ValueError, match="Triton kernel needs CUDA tensors"):
        depth_attention(q, k, v, ks, vs, attention=torch_causal_attention)
    with pytest.raises(ValueError, match="Triton kernel needs CUDA tensors"):
        depth_mix(q, k, v, ks, vs)
    out = depth_attention(q, k, v, ks, vs, mix="torch", attention=torch_causal_attention)  # torch mix: any device
    assert out.shape == q.shape


# ------------------------------------------------------------------ GPU, real sizes
GPU_GRID = [(1000, 1, 0), (1000, 2, 1), (1000, 4, 5), (1000, 8, 16), (999, 4, 16), (2048, 1, 16), (2048, 2, 5),
            (2048, 4, 1), (2048, 8, 0), (2048, 8, 16)]


@pytest.mark.gpu
@pytest.mark.parametrize("mix", ["triton", "torch"])
@pytest.mark.parametrize("T,G,S", GPU_GRID, ids=[f"T{t}-G{g}-S{s}" for t, g, s in GPU_GRID])
def test_gpu_bf16_default_backend(mix, T, G, S):
    """bf16, Hk = 8, d = 64, the default sequence backend (FA4 where installed), vs fp32."""
    name = sequence_backend(None, torch.bfloat16)[1]
    errs = check_case(mix, 1, T, G, 8, 64, S, torch.bfloat16, seed=T + G + S, ref_dtype=torch.float32, attention=None)
    print(f"{mix} via {name} T={T} G={G} S={S}: " + ", ".join(f"{k}={v:.2e}" for k, v in errs.items()))


@pytest.mark.gpu
@pytest.mark.parametrize("d,S,dtype", [(16, 64, torch.float16), (64, 16, torch.bfloat16), (128, 5, torch.float32),
                                       (32, 1, torch.bfloat16)])
def test_gpu_mix_kernel_alone(d, S, dtype):
    """The Triton mix alone at a real size (many programs) vs the fp64 mix reference; the torch
    mix must agree to the same tolerance."""
    B, T, Hk, G = 2, 4097, 8, 4
    q, k, v, ks, vs, _ = random_inputs(B, T, G * Hk, Hk, d, S, dtype, seed=d + S)
    dvm = torch.randn(B, T, Hk, d, device=q.device, dtype=dtype)
    ref = mix_reference(q, k, v, ks, vs, out_dtype=torch.float64)
    ref_grads = torch.autograd.grad(ref, (q, k, v, ks, vs), dvm.double())
    tol = TOLERANCE[dtype]
    for name, fn in MIXERS.items():
        vm = fn(q, k, v, ks, vs)
        grads = torch.autograd.grad(vm, (q, k, v, ks, vs), dvm)
        errs = [rel_err(vm, ref)] + [rel_err(g, r) for g, r in zip(grads, ref_grads)]
        assert max(errs) < tol, (name, errs)


@pytest.mark.gpu
def test_gpu_sequence_backend_names_what_runs():
    from moda_bench.kernels.moda.fa4.merge import fa4_unavailable
    fn, name = sequence_backend(None, torch.bfloat16)
    assert name == ("fa4" if fa4_unavailable() is None else "moda-triton")
    assert sequence_backend(None, torch.float32)[1] == "moda-triton"
    q, k, v, _, _, _ = random_inputs(1, 300, 8, 2, 64, 0, torch.bfloat16)
    assert rel_err(fn(q, k, v), torch_causal_attention(q.float(), k.float(), v.float())) < 1e-2
