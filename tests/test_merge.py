"""The log-sum-exp merges of two softmax partials: `kernel.merge_partials` (moda's "stream"
placement; `moda_merge_kernel`) and `fa4._merge` (moda-fa4 and moda-overlap; `fa4_merge_kernel`,
lse in FA4's (B,Hq,T) layout in and both layouts out).

Both write new tensors and leave their inputs as they were: merged in place, the Hopper build of
the kernel (Triton 3.6) let some threads store rows before others had loaded them, and 8-84 rows
of a T=32768 merge differed from run to run (experiments/overlap_check.py --lse).

CPU (Triton interpreter): against an fp64 merge written here, at row counts that are not a
multiple of the block (fp32 inputs, 1e-6 relative), inputs unchanged. GPU (`-m gpu`): the full
T=32768, Hq=64 merge three times, bitwise equal, and bf16 against the fp64 merge (1e-2); with
FA4 installed, three moda-fa4 / moda-overlap forwards at T=32768 bitwise equal.
"""
import pytest
import torch
from helpers import rel_err

from moda_bench.kernels.moda.fa4.merge import _merge, fa4_unavailable
from moda_bench.kernels.moda.triton.interface import merge_partials

HAS_CUDA = torch.cuda.is_available()
DEV = "cuda" if HAS_CUDA else "cpu"


def reference_merge(o1, l1, o2, l2):
    """fp64: o = (e^l1 o1 + e^l2 o2) / (e^l1 + e^l2), lse = log(e^l1 + e^l2); l (B,T,Hq)."""
    m = torch.maximum(l1, l2).double()
    w1, w2 = torch.exp(l1.double() - m), torch.exp(l2.double() - m)
    o = (w1[..., None] * o1.double() + w2[..., None] * o2.double()) / (w1 + w2)[..., None]
    return o, m + torch.log(w1 + w2)


def partials(B, T, Hq, d, dtype, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    o1 = torch.randn(B, T, Hq, d, generator=g, device=device).to(dtype)
    o2 = torch.randn(B, T, Hq, d, generator=g, device=device).to(dtype)
    l1 = 4 * torch.randn(B, T, Hq, generator=g, device=device)   # spread: either partial may dominate
    l2 = 4 * torch.randn(B, T, Hq, generator=g, device=device)
    return o1, l1, o2, l2


@pytest.mark.parametrize("B,T,Hq,d", [(1, 37, 3, 16), (2, 21, 6, 32), (1, 1, 1, 64)])
def test_merge_partials_against_fp64_and_leaves_its_inputs(B, T, Hq, d):
    o1, l1, o2, l2 = partials(B, T, Hq, d, torch.float32, DEV)
    before = [t.clone() for t in (o1, l1, o2, l2)]
    o, lse = merge_partials(o1, l1, o2, l2)
    ro, rl = reference_merge(o1, l1, o2, l2)
    assert rel_err(o, ro) < 1e-6 and rel_err(lse, rl) < 1e-6
    for t, b in zip((o1, l1, o2, l2), before):
        assert torch.equal(t, b)
    assert o.data_ptr() not in (o1.data_ptr(), o2.data_ptr())


@pytest.mark.parametrize("B,T,Hq,d", [(1, 37, 3, 16), (2, 21, 6, 32)])
def test_fa4_merge_against_fp64_both_lse_layouts_and_leaves_its_inputs(B, T, Hq, d):
    o1, l1, o2, l2 = partials(B, T, Hq, d, torch.float32, DEV, seed=1)
    l1_ht = l1.transpose(1, 2).contiguous()   # FA4's (B,Hq,T)
    before = [t.clone() for t in (o1, l1_ht, o2, l2)]
    o, lse_ht, lse_th = _merge(o1, l1_ht, o2, l2)
    ro, rl = reference_merge(o1, l1, o2, l2)
    assert rel_err(o, ro) < 1e-6 and rel_err(lse_th, rl) < 1e-6
    assert torch.equal(lse_ht, lse_th.transpose(1, 2))
    for t, b in zip((o1, l1_ht, o2, l2), before):
        assert torch.equal(t, b)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_gpu_merges_are_bitwise_repeatable_at_full_size():
    """The size where the in-place merge raced (B=1, T=32768, Hq=64, d=64: 2M rows), bf16."""
    o1, l1, o2, l2 = partials(1, 32768, 64, 64, torch.bfloat16, "cuda", seed=2)
    l1_ht = l1.transpose(1, 2).contiguous()
    ro, rl = reference_merge(o1, l1, o2, l2)
    runs = [merge_partials(o1, l1, o2, l2) for _ in range(3)]
    fruns = [_merge(o1, l1_ht, o2, l2) for _ in range(3)]
    torch.cuda.synchronize()
    for o, lse in runs[1:]:
        assert torch.equal(o, runs[0][0]) and torch.equal(lse, runs[0][1])
    for o, lse_ht, lse_th in fruns[1:]:
        assert torch.equal(o, fruns[0][0]) and torch.equal(lse_ht, fruns[0][1]) and torch.equal(lse_th, fruns[0][2])
    assert rel_err(runs[0][0], ro) < 1e-2 and rel_err(fruns[0][0], ro) < 1e-2
    assert rel_err(runs[0][1], rl) < 1e-6 and rel_err(fruns[0][2], rl) < 1e-6


@pytest.mark.gpu
@pytest.mark.skipif(fa4_unavailable() is not None, reason=f"FA4 unavailable: {fa4_unavailable()}")
@pytest.mark.parametrize("provider", ["moda-fa4", "moda-overlap"])
def test_gpu_fa4_routes_are_bitwise_repeatable_at_t32768(provider):
    from moda_bench.kernels.moda.fa4.merge import moda_fa4
    from moda_bench.kernels.moda.fa4.overlap import moda_overlap
    from moda_bench.timing import make_inputs
    fn = moda_fa4 if provider == "moda-fa4" else moda_overlap
    x = make_inputs(1, 32768, 64, 8, 64, 64, device="cuda", requires_grad=False, seed=5)
    args = [x[n] for n in ("q", "k", "v", "k_depth", "v_depth")]
    runs = [fn(*args, return_lse=True) for _ in range(3)]
    torch.cuda.synchronize()
    for o, lse in runs[1:]:
        assert torch.equal(o, runs[0][0]) and torch.equal(lse, runs[0][1])
