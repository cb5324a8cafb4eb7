"""The "tma" backward's two passes in one launch (`bwd_kv_beside=2`, `kernel_bwd_tma._one_kernel`):
against the fp64 reference (out, lse and all five gradients) at odd T, G in {1, 3, 8, 16}, L in
{0, 1, odd, several depth steps}, with chunked key-major items, detached depth and bf16; the same
gradients as the two launches (the same arithmetic: the key-major items compute their rows'
statistics as beside the dq pass), with descriptor and pointer loads; one launch a backward; the
rule (`kv_one`) and the options it needs (`kv_one_fits`); GPU: the eager call bitwise equal to the
two launches at T=1024, and under a CUDA graph.

CPU: the Triton interpreter (conftest sets TRITON_INTERPRET=1). Tolerances: helpers.TOLERANCE
(||err|| / ||ref||: fp32 1e-4, bf16 2e-2); equal arithmetic: 1e-6 relative (fp32).
"""
import pytest
import torch
from helpers import check_against_reference, graph_replayed, random_inputs, rel_err, small_tma_config
from helpers import grads_of as _grads

from moda_bench.kernels.moda import moda_attention
from moda_bench.kernels.moda.triton import bwd_tma as bwd_mod
from moda_bench.kernels.moda.triton import bwd_tma_rules as rules
from moda_bench.kernels.moda.triton import interface as kernel_mod


def _one(**kw):
    """Small tiles shared by both passes (`helpers.small_tma_config`), in one launch."""
    return small_tma_config(**dict(dict(bwd_kv_beside=2), **kw))


def _moda_lse(*args, **kw):
    return moda_attention(*args, return_lse=True, **kw)


# (B, T, G, L, d, config)
CASES = [
    (2, 37, 8, 5, 32, _one()),                                           # L=5 < BL: one masked depth step
    (1, 45, 8, 19, 32, _one()),                                          # 3 depth steps, the last masked
    (1, 33, 1, 3, 32, _one(bwd_block_l=32)),                             # G=1
    (2, 29, 3, 1, 32, _one(bwd_q_block_m=16, bwd_kv_block_m=16)),        # G=3: padding rows; L=1
    (1, 50, 16, 0, 32, _one()),                                          # L=0
    (2, 7, 2, 1, 32, _one(bwd_q_block_m=16, bwd_kv_block_m=16)),         # T shorter than a block
    (1, 61, 8, 9, 32, _one(bwd_kv_chunk=1)),                             # chunked key-major items
]


@pytest.mark.parametrize("B,T,G,L,d,cfg", CASES, ids=[f"T{c[1]}-G{c[2]}-L{c[3]}-{i}" for i, c in enumerate(CASES)])
def test_bwd_one_launch_gradients_fp32(B, T, G, L, d, cfg):
    check_against_reference(_moda_lse, B, T, G * 2, 2, d, L, torch.float32, seed=T + G + L, config=cfg)


def test_bwd_one_launch_bf16_and_detached_depth():
    """bf16 against the reference; depth_grad=False: no depth gradients, dq, dk, dv bitwise those of
    depth_grad=True."""
    check_against_reference(_moda_lse, 1, 41, 16, 2, 64, 7, torch.bfloat16, seed=3, config=_one())
    q, k, v, kd, vd, do = random_inputs(2, 23, 8, 2, 32, 6, torch.float32, seed=4)
    on_out, on = _grads(_one(), (q, k, v, kd, vd), do)
    off_out, off = _grads(_one(), (q, k, v, kd, vd), do, depth_grad=False)
    assert torch.equal(on_out, off_out) and off[3] is None and off[4] is None and on[3] is not None
    for a, b in zip(on[:3], off[:3]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("aligned", [True, False], ids=["descriptors", "pointers"])
def test_bwd_one_launch_same_gradients_as_two(monkeypatch, aligned):
    """One launch gives the gradients of the dq pass then the key-major pass (equal arithmetic),
    and issues one backward launch where the two passes issue two."""
    if not aligned:
        monkeypatch.setattr(kernel_mod, "aligned", lambda *t, **kw: False)
    q, k, v, kd, vd, do = random_inputs(2, 31, 6, 2, 32, 3, torch.float32, seed=6)
    launched = []
    for name in ("_DQ_LAUNCH", "_KV_LAUNCH", "_ONE_LAUNCH"):
        real = getattr(bwd_mod, name)
        monkeypatch.setattr(bwd_mod, name, lambda *a, _r=real, _n=name: launched.append(_n) or _r(*a))
    two = _grads(_one(bwd_kv_beside=0), (q, k, v, kd, vd), do)[1]
    assert launched == ["_DQ_LAUNCH", "_KV_LAUNCH"]
    launched.clear()
    one = _grads(_one(), (q, k, v, kd, vd), do)[1]
    assert launched == ["_ONE_LAUNCH"]
    for a, b in zip(two, one):
        assert rel_err(a, b) < 1e-6


def test_bwd_one_launch_needs_shared_options(monkeypatch):
    """Passes with different tiles, warps, stages or register caps cannot share a launch: said in one
    line where asked for, not taken by the rule; the rule's threshold decides otherwise."""
    q, k, v, kd, vd, _ = random_inputs(1, 20, 4, 2, 32, 3, torch.float32, seed=1)
    with pytest.raises(ValueError, match="bwd_q_block_n=16 != bwd_kv_block_n=32"):
        moda_attention(q, k, v, kd, vd, config=_one(bwd_kv_block_n=32)).sum().backward()
    cfg = _one(bwd_kv_beside=-1)
    assert rules.kv_one_fits(*rules.pass_options(cfg)) == ""
    assert "warps" in rules.kv_one_fits(*rules.pass_options(cfg.replace(bwd_kv_warps=8)))
    assert rules.kv_one_fits(*rules.pass_options(cfg), heads=True) == "a dq pass a query head a program"
    monkeypatch.setattr(rules, "KV_ONE_MAX_T", 1024)
    assert rules.kv_one(cfg, 1024, 64, capturing=False) and not rules.kv_one(cfg, 1025, 64, capturing=False)
    assert not rules.kv_one(cfg, 1024, 64, capturing=True)   # under a graph the two launches stay
    assert not rules.kv_one(cfg, 1024, 0, capturing=False)   # L = 0: not measured faster
    assert not rules.kv_one(cfg.replace(bwd_kv_warps=8), 1, 64, capturing=False)
    assert rules.kv_one(cfg.replace(bwd_kv_beside=2), 1 << 20, 0)
    assert not rules.kv_one(cfg.replace(bwd_kv_beside=1), 1, 64)
    assert not rules.kv_beside(cfg.replace(bwd_kv_beside=2), 1, 64, 1, 8, 64, 132, capturing=True)


@pytest.mark.gpu
def test_gpu_one_launch_matches_two_at_t1024():
    """On the GPU at the eager row's shape (T=1024, G=8, L=64, bf16, the default's tiles): one launch
    gives bitwise the gradients of the two (each key-major tile's rows summed in the same order), and a
    CUDA graph of the one-launch call replays them."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    q, k, v, kd, vd, do = random_inputs(1, 1024, 64, 8, 64, 64, torch.bfloat16, seed=0, dev="cuda")
    base = kernel_mod.resolve_config(kernel_mod.MoDAShape(1, 1024, 64, 8, 64, 64), torch.bfloat16)
    if base.bwd_depth != "tma":
        pytest.skip("the default backward here is not the descriptor one")
    two = _grads(base.replace(bwd_kv_beside=0), (q, k, v, kd, vd), do)[1]
    one = _grads(base.replace(bwd_kv_beside=2), (q, k, v, kd, vd), do)[1]
    for a, b in zip(two, one):
        assert torch.equal(a, b)
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v, kd, vd)]
    cfg = base.replace(bwd_kv_beside=2)
    graph_replayed(lambda: moda_attention(*leaves, config=cfg).backward(do), leaves)
    for a, x in zip(one, leaves):
        assert torch.equal(a, x.grad)


def test_bwd_one_launch_orders_agree(monkeypatch):
    """The one launch's two orders (`ONE_WAIT`): dq row blocks first with the key-major items waiting
    for their stored row statistics, and key-major items first computing them: the same gradients,
    with chunked items too; the counters are back at 0 after each call (a second call agrees)."""
    q, k, v, kd, vd, do = random_inputs(1, 37, 8, 2, 32, 5, torch.float32, seed=2)
    for chunk in (-1, 1):
        monkeypatch.setattr(rules, "ONE_WAIT", True)
        waited = _grads(_one(bwd_kv_chunk=chunk), (q, k, v, kd, vd), do)[1]
        again = _grads(_one(bwd_kv_chunk=chunk), (q, k, v, kd, vd), do)[1]
        assert all(int(c.abs().sum()) == 0 for c in bwd_mod._ONE_COUNTERS.values())
        monkeypatch.setattr(rules, "ONE_WAIT", False)
        monkeypatch.setattr(rules, "_PLANS", {})
        computed = _grads(_one(bwd_kv_chunk=chunk), (q, k, v, kd, vd), do)[1]
        monkeypatch.setattr(rules, "_PLANS", {})
        for a, b, c in zip(waited, again, computed):
            assert torch.equal(a, b) and rel_err(a, c) < 1e-6
