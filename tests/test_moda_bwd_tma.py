"""`moda_attention` with the folded-row backward (`bwd_depth="tma"`, kernel_bwd_tma) against the
fp64 reference: out, lse and all five gradients at odd T (not a multiple of any block), G in
{1, 2, 3, 8, 16, 32} (3 and 6: a q/do box's padding rows hold the next KV head's rows), L in
{0, 1, odd, more than one depth step}, B = 2, d 32/64, fp32 and bf16; descriptor and pointer
loads (same answer); either order of a step's products (dp first or after); detached depth (no
depth gradients, the other three bitwise unchanged); the pointer fallback where a caller passes
delta or asks for the depth part alone; the default's choice; the config check; moda-fa4's depth
launch under the new default.

CPU: the Triton interpreter runs the device-side descriptors (conftest sets TRITON_INTERPRET=1).
Tolerances: helpers.TOLERANCE (||err|| / ||ref||: fp32 1e-4, bf16 2e-2).
"""
import pytest
import torch
from helpers import check_against_reference, graph_replayed, random_inputs, rel_err, small_tma_config
from helpers import grads_of as _grads

from moda_bench.kernels.moda import MoDAConfig, moda_attention
from moda_bench.kernels.moda import config as config_mod
from moda_bench.kernels.moda.triton import interface as kernel_mod
from moda_bench.kernels.moda.triton.interface import moda_bwd, moda_fwd
from moda_bench.kernels.moda.validate import MoDAShape


def _moda_lse(*args, **kw):
    return moda_attention(*args, return_lse=True, **kw)


def _bt(**kw):
    """A "tma" backward with small tiles: several row blocks, key tiles, diagonal and depth steps."""
    return small_tma_config(**dict(dict(bwd_kv_beside=0), **kw))  # two launches (one: test_moda_bwd_one)


# (B, T, G, L, d, config)
CASES = [
    (2, 37, 8, 5, 32, _bt()),                                          # L=5 < BL=8: one masked depth step
    (2, 45, 8, 19, 32, _bt()),                                         # L=19: 3 depth steps, the last masked
    (1, 33, 1, 3, 32, _bt(bwd_block_l=32)),                            # G=1: 16 positions a sub-tile
    (2, 29, 3, 1, 32, _bt(bwd_q_block_m=16, bwd_kv_block_m=16)),       # G=3: padding rows; L=1
    (1, 50, 16, 0, 32, _bt()),                                         # L=0 through the folded passes
    (2, 7, 2, 1, 32, _bt(bwd_q_block_m=16, bwd_kv_block_m=16)),        # T shorter than a block
    (1, 40, 16, 7, 32, _bt(bwd_q_block_m=16, bwd_kv_block_m=64, bwd_kv_block_n=32)),  # widened to GP rows
    (1, 21, 6, 9, 64, _bt(bwd_q_block_m=64, bwd_kv_block_m=16, bwd_depth_stages=1)),  # kv rows widened to GP=8
    (1, 19, 32, 2, 32, _bt(bwd_q_block_m=32, bwd_kv_block_m=32)),      # G=32: one position a block
    (2, 53, 2, 0, 32, _bt(bwd_kv_block_n=64, bwd_q_block_n=32, bwd_kv_maxnreg=168)),  # maxnreg: a GPU-only hint
]


@pytest.mark.parametrize("B,T,G,L,d,cfg", CASES, ids=[f"T{c[1]}-G{c[2]}-L{c[3]}-d{c[4]}-{i}"
                                                      for i, c in enumerate(CASES)])
def test_bwd_tma_gradients_fp32(B, T, G, L, d, cfg):
    check_against_reference(_moda_lse, B, T, G * 2, 2, d, L, torch.float32, seed=T + G + L, config=cfg)


# the key-major pass beside the dq pass (bwd_kv_beside=1: its rows' lse2 and delta computed in it)
BESIDE = [3, 4, 5, 6, 8, 9]


@pytest.mark.parametrize("i", BESIDE, ids=[f"T{CASES[i][1]}-G{CASES[i][2]}-L{CASES[i][3]}" for i in BESIDE])
def test_bwd_tma_kv_beside_fp32(i):
    B, T, G, L, d, cfg = CASES[i]
    check_against_reference(_moda_lse, B, T, G * 2, 2, d, L, torch.float32, seed=T + G + L,
                            config=cfg.replace(bwd_kv_beside=1))


@pytest.mark.parametrize("aligned", [True, False], ids=["descriptors", "pointers"])
def test_bwd_tma_kv_beside_same_gradients(monkeypatch, aligned):
    """The key-major pass with its own row statistics gives the gradients of the one that reads
    the dq pass's (the same arithmetic), with descriptor and with pointer loads; padding rows
    (G=3) add nothing."""
    if not aligned:
        monkeypatch.setattr(kernel_mod, "aligned", lambda *t, **kw: False)
    q, k, v, kd, vd, do = random_inputs(2, 31, 6, 2, 32, 3, torch.float32, seed=6)
    after = _grads(_bt(bwd_q_block_m=16, bwd_kv_block_m=16, bwd_kv_beside=0), (q, k, v, kd, vd), do)[1]
    beside = _grads(_bt(bwd_q_block_m=16, bwd_kv_block_m=16, bwd_kv_beside=1), (q, k, v, kd, vd), do)[1]
    for a, b in zip(after, beside):
        assert rel_err(a, b) < 1e-6


@pytest.mark.parametrize("T,G,L", [(37, 8, 5), (29, 3, 1), (50, 16, 0)])
def test_bwd_tma_dq_blocks_mixed_same_gradients(T, G, L):
    """The dq pass's row blocks visited heavy and light alternately (MIX, odd and even block
    counts) give bitwise the gradients of the heaviest-first order; `dq_mix` picks it at L > 0
    and T <= DQ_MIX_MAX_T."""
    from moda_bench.kernels.moda.triton.bwd_tma import DQ_MIX_MAX_T, dq_mix, moda_bwd_tma
    q, k, v, kd, vd, do = (x.detach() if x is not None else None for x in random_inputs(2, T, 2 * G, 2, 32, L,
                                                                                         torch.float32, seed=T))
    shape = MoDAShape(B=2, T=T, Hq=2 * G, Hk=2, d=32, L=L)
    o, lse = moda_fwd(q, k, v, kd, vd, 32 ** -0.5, shape, _bt())
    kw = dict(q_block_m=16, q_block_n=16, kv_block_m=16, kv_block_n=16, block_l=16, q_stages=2,
              kv_stages=2)
    runs = [moda_bwd_tma(do, q, k, v, kd, vd, o, lse, 32 ** -0.5, G, mix=mix, **kw) for mix in (False, True)]
    for a, b in zip(*runs):
        assert (a is None and b is None) or torch.equal(a, b)
    assert dq_mix(DQ_MIX_MAX_T, 1) and not dq_mix(DQ_MIX_MAX_T + 1, 64) and not dq_mix(1024, 0)


@pytest.mark.parametrize("T,G,L", [(37, 8, 5), (50, 16, 0)])
def test_bwd_tma_dp_first_same_gradients(T, G, L):
    """Each pass's dp product issued before or after the exponentials (DP_FIRST, forced both ways
    in either pass) gives bitwise the same gradients; `dp_first` issues it first in the key-major
    pass where its registers are not capped."""
    from moda_bench.kernels.moda.triton.bwd_tma import moda_bwd_tma
    from moda_bench.kernels.moda.triton.bwd_tma_rules import dp_first
    q, k, v, kd, vd, do = (x.detach() if x is not None else None for x in random_inputs(2, T, 2 * G, 2, 32, L,
                                                                                         torch.float32, seed=T + 1))
    shape = MoDAShape(B=2, T=T, Hq=2 * G, Hk=2, d=32, L=L)
    o, lse = moda_fwd(q, k, v, kd, vd, 32 ** -0.5, shape, _bt())
    kw = dict(q_block_m=32, q_block_n=16, kv_block_m=32, kv_block_n=16, block_l=16, q_stages=2, kv_stages=2)
    runs = [moda_bwd_tma(do, q, k, v, kd, vd, o, lse, 32 ** -0.5, G, dp_first=order, **kw)
            for order in (None, (False, False), (True, False), (False, True))]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert (a is None and b is None) or torch.equal(a, b)
    assert dp_first(0) and not dp_first(168)


def test_kv_beside_rule():
    """bwd_kv_beside -1 runs the key-major pass beside the dq pass under a CUDA graph capture, at
    L > 0 and G <= KV_BESIDE_MAX_G, where its grid has at most KV_BESIDE_MAX_WAVES programs a
    multiprocessor, chunks counted (a chunked pass fills the SMs itself: at T=1024 the rule's
    chunks turn it off); 0 and 1 decide alone; other values are refused."""
    from moda_bench.kernels.moda.triton.bwd_tma import KV_BESIDE_MAX_G, KV_BESIDE_MAX_WAVES, kv_beside
    cfg = MoDAConfig(bwd_kv_block_n=64, bwd_kv_chunk=0)
    n = int(KV_BESIDE_MAX_WAVES * 132)
    T = 64 * (n // 8)
    G = KV_BESIDE_MAX_G
    assert kv_beside(cfg, 1, T, 8, G, 64, 132, capturing=True)           # n // 8 * 8 <= n programs
    assert not kv_beside(cfg, 1, T, 8, G, 64, 132, capturing=False)      # eager: host-bound there
    assert not kv_beside(cfg, 1, T, 8, G, 64, 132)                       # no capture running here
    assert not kv_beside(cfg, 1, T, 8, G, 0, 132, capturing=True)        # L = 0: the dq pass is short
    assert not kv_beside(cfg, 1, T, 8, 2 * G, 64, 132, capturing=True)   # long key-major programs
    assert not kv_beside(cfg, 1, T + 64 * 2, 8, G, 64, 132, capturing=True)  # more than n
    assert kv_beside(cfg.replace(bwd_kv_beside=1), 4, 65536, 8, 32, 0, 132)
    assert not kv_beside(cfg.replace(bwd_kv_beside=0), 1, 64, 1, 1, 64, 132, capturing=True)
    assert not kv_beside(cfg.replace(bwd_kv_chunk=-1), 1, T, 8, G, 64, 132, capturing=True)  # chunked
    assert kv_beside(cfg.replace(bwd_kv_chunk=-1), 1, T, 8, 1, 64, 132, capturing=True)  # G=1: 16-step tiles
    with pytest.raises(ValueError, match="bwd_kv_beside=3"):
        moda_attention(*random_inputs(1, 8, 4, 2, 32, 2, torch.float32)[:5], config=_bt(bwd_kv_beside=3))


@pytest.mark.gpu
def test_gpu_kv_beside_under_graph_capture(monkeypatch):
    """T=1000, G=8, L=64, unchunked: an eager fwd+bwd keeps the key-major pass after the dq pass,
    the same call captured into a CUDA graph runs it beside (its default there); the replayed gradients
    equal the eager ones to bf16 rounding."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    seen = []
    cfg = kernel_mod.resolve_config(MoDAShape(B=1, T=1000, Hq=64, Hk=8, d=64, L=64), torch.bfloat16).replace(
        bwd_kv_chunk=0, bwd_depth_items=0)  # unchunked: small grid (chunked, it fills the SMs itself: after)
    real = kernel_mod.moda_bwd_tma
    monkeypatch.setattr(kernel_mod, "moda_bwd_tma",
                        lambda *a, **k: seen.append(k["beside"] is not None) or real(*a, **k))
    ins = list(random_inputs(1, 1000, 64, 8, 64, 64, torch.bfloat16, seed=7))
    do = ins.pop()

    def step():
        for x in ins:
            x.grad = None
        moda_attention(*ins, config=cfg).backward(do)

    step()
    eager = [x.grad.clone() for x in ins]
    graph_replayed(lambda: moda_attention(*ins, config=cfg).backward(do), ins)
    assert seen == [False, False, True]
    for a, x in zip(eager, ins):
        assert rel_err(x.grad, a) < 1e-2


@pytest.mark.parametrize("G", [8, 32])
def test_bwd_tma_bf16_default_tiles(G):
    """The Hopper default's tiles (64 x 64, 4 warps, 128 depth rows and at most 32 columns a
    step: G=8 2 positions x 16 entries, G=32 one position x 32) on bf16 inputs."""
    cfg = MoDAConfig(bwd_depth="tma", bwd_block_l=config_mod.tma_block_l(G, 64, 128, 32))
    assert cfg.bwd_block_l == 32
    check_against_reference(_moda_lse, 1, 77 if G == 8 else 45, G, 1, 64, 6 if G == 8 else 37, torch.bfloat16,
                            seed=3, config=cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("T,G,L", [(1000, 32, 64), (333, 32, 1), (4099, 32, 16), (4099, 64, 3)])
def test_gpu_default_config_wide_groups(T, G, L):
    """The heuristic default at G >= 32 on Hopper (the dq pass at 32 depth columns a step, 168
    registers above T = 4096) against the fp64 reference: out, lse and all five gradients, bf16."""
    check_against_reference(_moda_lse, 1, T, G, 1, 64, L, torch.bfloat16, seed=T + G + L)


def test_bwd_tma_descriptors_and_pointers_agree(monkeypatch):
    """The descriptor kernel runs where usable; unaligned inputs or no descriptors take the
    pointer loads of the same kernels (same arithmetic): equal to rounding."""
    calls = []
    real = kernel_mod.moda_bwd_tma
    monkeypatch.setattr(kernel_mod, "moda_bwd_tma", lambda *a, **k: calls.append(k["use_desc"]) or real(*a, **k))
    q, k, v, kd, vd, do = random_inputs(2, 31, 8, 2, 32, 3, torch.float32, seed=4)
    cfg = _bt()
    _, g_desc = _grads(cfg, (q, k, v, kd, vd), do)
    monkeypatch.setattr(kernel_mod, "aligned", lambda *t, **kw: False)
    _, g_ptr = _grads(cfg, (q, k, v, kd, vd), do)
    assert calls == [True, False]
    for a, b in zip(g_desc, g_ptr):
        assert rel_err(a, b) < 1e-5


def test_bwd_tma_detached_depth():
    """depth_grad=False: no depth gradients, and dq, dk, dv bitwise those of depth_grad=True."""
    q, k, v, kd, vd, do = random_inputs(1, 35, 8, 2, 32, 5, torch.float32, seed=9)
    on_out, on = _grads(_bt(), (q, k, v, kd, vd), do)
    off_out, off = _grads(_bt(), (q, k, v, kd, vd), do, depth_grad=False)
    assert torch.equal(on_out, off_out)
    assert off[3] is None and off[4] is None and on[3] is not None
    for a, b in zip(on[:3], off[:3]):
        assert torch.equal(a, b)


def test_bwd_tma_caller_delta_takes_the_pointer_passes():
    """moda_bwd with a caller's delta, or depth-only (moda-fa4's launch), under a "tma" config
    runs the pointer kernels: the same gradients as the folded passes."""
    q, k, v, kd, vd, do = random_inputs(1, 29, 4, 2, 32, 3, torch.float32, seed=2)
    shape = MoDAShape(B=1, T=29, Hq=4, Hk=2, d=32, L=3)
    cfg = _bt()
    scale = 32 ** -0.5
    o, lse = moda_fwd(q, k, v, kd, vd, scale, shape, cfg)
    folded = moda_bwd(do, q, k, v, kd, vd, o, lse, scale, shape, cfg)
    delta = (o.float() * do.float()).sum(-1)
    pointer = moda_bwd(do, q, k, v, kd, vd, o, lse, scale, shape, cfg, delta=delta)
    for a, b in zip(folded, pointer):
        assert rel_err(a, b) < 1e-5
    dq_d, _, _, dkd, dvd = moda_bwd(do, q, k, v, kd, vd, o, lse, scale, shape, cfg, depth_only=True, delta=delta)
    assert rel_err(dkd, folded[3]) < 1e-5 and rel_err(dvd, folded[4]) < 1e-5


def test_bwd_tma_config_check():
    x = random_inputs(1, 8, 16, 2, 32, 2, torch.float32)[:5]
    with pytest.raises(ValueError, match="bwd_block_l=24"):
        moda_attention(*x, config=_bt(bwd_block_l=24))
    with pytest.raises(ValueError, match="bwd_kv_maxnreg=8"):
        moda_attention(*x, config=_bt(bwd_kv_maxnreg=8))
    with pytest.raises(ValueError, match="bwd_depth='nope'"):
        moda_attention(*x, config=MoDAConfig(bwd_depth="nope"))


def test_bwd_tma_default_choice(monkeypatch):
    """The heuristic runs the backward as "tma" only where bwd_tma_default says so (Hopper,
    d <= 64, 16-bit; any T and G), with 64 x 64 tiles at 4 warps and, above T = 4096, 168
    registers in both passes; off a GPU it keeps the pointer placements."""
    shape = MoDAShape(B=1, T=16384, Hq=64, Hk=8, d=64, L=64)
    monkeypatch.setattr(config_mod, "current_device_index", lambda: -1)
    assert config_mod.default_config(shape, torch.bfloat16).bwd_depth != "tma"  # no CUDA
    for T in (2048, 4096):  # the fallback placement is the pointer default's
        pointer = config_mod.default_config(MoDAShape(B=1, T=T, Hq=64, Hk=8, d=64, L=64), torch.bfloat16)
        assert config_mod.pointer_bwd_depth(T) == pointer.bwd_depth
    monkeypatch.setattr(config_mod, "current_device_index", lambda: 0)
    monkeypatch.setattr(config_mod, "_capability", lambda idx: 9)
    cfg = config_mod.default_config(shape, torch.bfloat16)
    assert (cfg.bwd_depth, cfg.bwd_q_block_m, cfg.bwd_kv_block_m, cfg.bwd_kv_block_n, cfg.bwd_kv_warps) == \
        ("tma", 64, 64, 64, 4)
    assert (cfg.bwd_kv_maxnreg, cfg.bwd_q_maxnreg, cfg.bwd_block_l) == (168, 168, 32)
    config_mod.check_config(cfg, 8)
    l0 = config_mod.default_config(MoDAShape(B=1, T=16384, Hq=64, Hk=8, d=64, L=0), torch.bfloat16)
    assert l0.bwd_depth == "tma" and (l0.bwd_q_maxnreg, l0.bwd_kv_maxnreg) == (168, 168)
    short = config_mod.default_config(MoDAShape(B=1, T=4096, Hq=64, Hk=8, d=64, L=64), torch.bfloat16)
    assert short.bwd_depth == "tma" and (short.bwd_q_maxnreg, short.bwd_kv_maxnreg) == (0, 0)
    g32 = config_mod.default_config(MoDAShape(B=1, T=4096, Hq=256, Hk=8, d=64, L=64), torch.bfloat16)
    assert (g32.bwd_q_block_m, g32.bwd_kv_block_m) == (64, 64)
    # G=32: one position a 32-row sub-tile, 32 depth columns a step (64 spilled under the cap)
    assert g32.bwd_block_l == 32 and config_mod.default_config(MoDAShape(
        B=1, T=16384, Hq=256, Hk=8, d=64, L=64), torch.bfloat16).bwd_block_l == 32
    config_mod.check_config(g32, 32)
    assert not config_mod.bwd_tma_default(MoDAShape(B=1, T=64, Hq=8, Hk=1, d=128, L=4), torch.bfloat16)
    assert not config_mod.bwd_tma_default(shape, torch.float32)
    monkeypatch.setattr(config_mod, "_capability", lambda idx: 8)
    assert not config_mod.bwd_tma_default(shape, torch.bfloat16)


def test_pointer_bwd_config_of_a_tma_config():
    """A "tma" backward config for the pointer kernels: the pointer default's placement, block_l
    and 2 depth stages (the tma dq pass's 3 at T <= 4096 slowed the pointer depth-only launch
    1.43x); any other config unchanged."""
    from moda_bench.kernels.moda.triton.interface import pointer_bwd_config
    tma = _bt(bwd_depth_stages=3, bwd_block_l=32)
    for T in (2048, 4096, 16384):
        got = pointer_bwd_config(tma, T, 64)
        assert (got.bwd_depth, got.bwd_block_l, got.bwd_depth_stages) == \
            (config_mod.pointer_bwd_depth(T), config_mod.pointer_block_l(64), 2)
        assert got.replace(bwd_depth="tma", bwd_block_l=32, bwd_depth_stages=3) == tma  # nothing else changed
    other = MoDAConfig(bwd_depth="stream", bwd_depth_stages=3)
    assert pointer_bwd_config(other, 4096, 64) is other


@pytest.mark.parametrize("T,side", [(4096, True), (2048, False)])
def test_moda_fa4_depth_launch_under_the_tma_backward(monkeypatch, T, side):
    """moda-fa4 under a "tma" backward: its depth-only launch keeps the pointer kernels' block_l
    and the placement the pointer default had (a side stream above FUSED_DEPTH_MAX_T)."""
    from moda_bench.kernels.moda.fa4 import merge as fa4_mod
    q, k, v, kd, vd, do = random_inputs(1, 8, 4, 2, 32, 3, torch.float32)
    seen = {}

    def fake_bwd(*a, **kw):
        seen["cfg"] = a[10]
        return torch.zeros_like(q), None, None, kd, vd

    def fake_beside(dev, main, depth, on_side, after, high_priority=False):
        seen["side"] = on_side
        return main(), depth()

    class Backend:
        @staticmethod
        def bwd(*a):
            return torch.zeros_like(q), k, v

    monkeypatch.setattr(fa4_mod, "moda_bwd", fake_bwd)
    monkeypatch.setattr(fa4_mod, "_beside", fake_beside)
    monkeypatch.setattr(fa4_mod, "launch_delta", lambda *a: None)
    shape = MoDAShape(B=1, T=T, Hq=4, Hk=2, d=32, L=3)
    fa4_mod._backward(do, q, k, v, kd, vd, q, None, torch.zeros(1, 8, 4), 1.0, shape, _bt(), Backend)
    assert seen["side"] is side
    assert seen["cfg"].bwd_depth == "split" and seen["cfg"].bwd_block_l == config_mod.pointer_block_l(3)
