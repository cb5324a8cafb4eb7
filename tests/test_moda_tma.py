"""`moda_attention` with the descriptor-load forward (`fwd_depth="tma"`, kernel_fwd_tma) against
the fp64 reference: out, lse and all five gradients (the backward is the pointer kernels',
reading the tma forward's o and lse), at odd T (not a multiple of any block), G in {1, 2, 3, 8,
16}, L in {0, 1, odd, more than one depth step}, B = 2; the fallback to the pointer "fused"
placement where descriptors cannot be used; the default's choice and the config check.

CPU: the Triton interpreter runs the device-side descriptors (conftest sets TRITON_INTERPRET=1).
Tolerances: helpers.TOLERANCE (||err|| / ||ref||: fp32 1e-4, bf16 2e-2).
"""
import pytest
import torch
from helpers import check_against_reference, random_inputs, rel_err

from moda_bench.kernels.moda import MoDAConfig, depth_utilization, moda_attention
from moda_bench.kernels.moda import config as config_mod
from moda_bench.kernels.moda.triton import interface as kernel_mod
from moda_bench.kernels.moda.validate import MoDAShape


def _moda_lse(*args, **kw):
    return moda_attention(*args, return_lse=True, **kw)


def _tma(**kw):
    return MoDAConfig(fwd_depth="tma", **kw)


# (B, T, G, L, d, config): small tiles so that several row blocks, key tiles and depth steps run
CASES = [
    (2, 37, 8, 5, 32, _tma(block_m=32, block_n=16, block_l=16)),      # L=5 < BL=8: one masked step
    (2, 45, 8, 19, 32, _tma(block_m=32, block_n=16, block_l=16)),     # L=19: 3 steps of 8, the last masked
    (1, 33, 1, 3, 32, _tma(block_m=32, block_n=16, block_l=32)),      # G=1: 16 positions a sub-tile
    (2, 29, 3, 1, 32, _tma(block_m=16, block_n=16, block_l=16)),      # G=3: padded rows, L=1
    (1, 50, 16, 0, 32, _tma(block_m=32, block_n=32)),                 # L=0 through the tma kernel
    (2, 7, 2, 1, 32, _tma(block_m=16, block_n=16, block_l=16)),       # T shorter than a block
    (1, 40, 16, 7, 32, _tma(block_m=16, block_n=16, block_l=16)),     # one position a block
    (1, 21, 4, 9, 64, _tma(block_m=32, block_n=16, block_l=16, depth_stages=1)),
    (1, 23, 32, 37, 32, _tma(block_m=64, block_n=16, block_l=32, num_warps=4, fwd_maxnreg=168)),  # G=32's default
]


@pytest.mark.parametrize("B,T,G,L,d,cfg", CASES, ids=[f"T{c[1]}-G{c[2]}-L{c[3]}-d{c[4]}-{i}"
                                                      for i, c in enumerate(CASES)])
def test_tma_forward_and_gradients_fp32(B, T, G, L, d, cfg):
    check_against_reference(_moda_lse, B, T, G * 2, 2, d, L, torch.float32, seed=T + G + L, config=cfg)


# the backward's descriptor loads (bwd_tma): G=3 and G=6 put the next KV head's query heads in a
# q/do box's padding rows (they must add nothing), bwd_kv_block_m=16 < GP=32 keeps pointer loads
BWD_CASES = [
    (2, 37, 3, 5, _tma(block_m=16, block_n=16, block_l=16, bwd_tma=True, bwd_q_block_m=16, bwd_q_block_n=16,
                       bwd_kv_block_m=16, bwd_kv_block_n=16, bwd_depth="fused")),
    (1, 45, 8, 0, MoDAConfig(bwd_tma=True, bwd_q_block_m=32, bwd_q_block_n=16, bwd_kv_block_m=32, bwd_kv_block_n=16)),
    (2, 29, 1, 7, MoDAConfig(bwd_tma=True, bwd_q_block_m=16, bwd_q_block_n=32, bwd_kv_block_m=16, bwd_kv_block_n=32,
                             bwd_depth="stream")),
    (1, 33, 6, 3, MoDAConfig(bwd_tma=True, block_m=32, bwd_q_block_m=32, bwd_q_block_n=16, bwd_kv_block_m=32,
                             bwd_kv_block_n=16, bwd_depth="split")),
    (1, 21, 32, 2, MoDAConfig(bwd_tma=True, block_m=32, bwd_q_block_m=32, bwd_q_block_n=16, bwd_kv_block_m=16,
                              bwd_kv_block_n=16, bwd_depth="overlap")),
]


@pytest.mark.parametrize("B,T,G,L,cfg", BWD_CASES, ids=[f"T{c[1]}-G{c[2]}-L{c[3]}-{i}" for i, c in
                                                       enumerate(BWD_CASES)])
def test_bwd_tma_gradients_fp32(B, T, G, L, cfg):
    check_against_reference(_moda_lse, B, T, G * 2, 2, 32, L, torch.float32, seed=T + 3 * G + L, config=cfg)


def test_bwd_tma_bf16():
    cfg = MoDAConfig(bwd_tma=True, bwd_q_block_m=32, bwd_q_block_n=16, bwd_kv_block_m=32, bwd_kv_block_n=16)
    check_against_reference(_moda_lse, 1, 41, 8, 2, 64, 5, torch.bfloat16, seed=5, config=cfg)


def test_tma_default_tiles_bf16():
    """The default tma tiles (128 rows x 64 keys, auto depth step) on a bf16 problem shorter than
    one row block."""
    cfg = _tma(block_m=128, block_n=64, num_warps=8, block_l=config_mod.tma_block_l(8, 128))
    check_against_reference(_moda_lse, 1, 19, 8, 1, 64, 6, torch.bfloat16, seed=3, config=cfg)


def test_tma_runs_the_descriptor_kernel(monkeypatch):
    """fwd_depth="tma" launches kernel_fwd_tma and nothing of kernel_fwd; unaligned or
    descriptor-less cases fall back to the pointer "fused" placement with the same answer."""
    calls = []
    real = kernel_mod.moda_fwd_tma
    monkeypatch.setattr(kernel_mod, "moda_fwd_tma", lambda *a, **k: calls.append(1) or real(*a, **k))
    q, k, v, kd, vd, _ = random_inputs(1, 23, 4, 2, 32, 3, torch.float32)
    cfg = _tma(block_m=16, block_n=16, block_l=16)
    out = moda_attention(q, k, v, kd, vd, config=cfg)
    assert calls == [1]
    usable = kernel_mod.tma_usable
    q_odd = torch.empty(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape).copy_(q)  # 4 bytes off 16-byte alignment
    assert not usable(q_odd, k, v, kd, vd, 3) and usable(q, k, v, kd, vd, 3)
    monkeypatch.setattr(kernel_mod, "tma_usable", lambda *a: False)
    fallback = moda_attention(q, k, v, kd, vd, config=cfg)
    assert calls == [1]
    assert rel_err(fallback, out) < 1e-5
    monkeypatch.setattr(kernel_mod, "tma_usable", usable)
    monkeypatch.setattr(kernel_mod, "descriptors_available", lambda: False)
    assert rel_err(moda_attention(q, k, v, kd, vd, config=cfg), out) < 1e-5
    assert calls == [1]


def test_tma_config_check():
    with pytest.raises(ValueError, match="block_l"):  # 24 columns: not S x a power of two
        moda_attention(*random_inputs(1, 8, 16, 2, 32, 2, torch.float32)[:5],
                       config=_tma(block_m=32, block_l=24))
    with pytest.raises(ValueError, match="fwd_depth='nope'"):
        moda_attention(*random_inputs(1, 8, 4, 2, 32, 2, torch.float32)[:5],
                       config=MoDAConfig(fwd_depth="nope"))


def test_tma_default_choice(monkeypatch):
    """The heuristic picks "tma" only where tma_default says so (Hopper, d <= 64, 16-bit), with
    the descriptor tiles; off a GPU it keeps the pointer placements."""
    shape = MoDAShape(B=1, T=4096, Hq=64, Hk=8, d=64, L=64)
    monkeypatch.setattr(config_mod, "current_device_index", lambda: -1)
    assert config_mod.default_config(shape, torch.bfloat16).fwd_depth != "tma"  # no CUDA
    monkeypatch.setattr(config_mod, "tma_default", lambda s, dt=None: True)
    cfg = config_mod.default_config(shape, torch.bfloat16)
    assert (cfg.fwd_depth, cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages) == ("tma", 64, 64, 4, 3)
    assert cfg.block_l == 32  # G=8: 2 positions x 16 entries a step, 8 positions x 16 = 128 rows
    config_mod.check_config(cfg, 8)
    assert config_mod.tma_block_l(1, 128) == 32 and config_mod.tma_block_l(16, 128) == 32
    assert config_mod.tma_block_l(2, 64) == 64
    for G in (1, 2, 3, 4, 8, 16):  # the backward's 32-column cap leaves G <= 16 as 128 rows gave them
        gp = config_mod.group_pad(G)
        assert config_mod.tma_block_l(G, max(64, gp), 128, 32) == config_mod.tma_block_l(G, max(64, gp), 128) == 32
    assert config_mod.tma_block_l(32, 64, 128) == 64 and config_mod.tma_block_l(32, 64, 128, 32) == 32
    assert config_mod.tma_block_l(64, 64, 128, 16) == 16
    monkeypatch.undo()
    monkeypatch.setattr(config_mod, "current_device_index", lambda: 0)
    monkeypatch.setattr(config_mod, "_capability", lambda idx: 9)
    assert config_mod.tma_default(shape, torch.bfloat16)
    assert not config_mod.tma_default(MoDAShape(B=1, T=64, Hq=8, Hk=1, d=128, L=4), torch.bfloat16)
    assert not config_mod.tma_default(shape, torch.float32)
    assert config_mod.tma_default(MoDAShape(B=1, T=2048, Hq=64, Hk=8, d=64, L=64), torch.bfloat16)  # short T
    assert config_mod.tma_default(MoDAShape(B=1, T=1024, Hq=32, Hk=16, d=64, L=1), torch.bfloat16)  # G=2
    assert not config_mod.tma_default(MoDAShape(B=1, T=2048, Hq=64, Hk=8, d=64, L=0), torch.bfloat16)  # L=0
    assert not config_mod.tma_default(MoDAShape(B=1, T=1024, Hq=8, Hk=8, d=64, L=64), torch.bfloat16)  # G=1
    assert config_mod.tma_default(MoDAShape(B=1, T=2049, Hq=8, Hk=8, d=64, L=0), torch.bfloat16)
    assert config_mod.tma_default(MoDAShape(B=1, T=4096, Hq=256, Hk=8, d=64, L=64), torch.bfloat16)  # G=32
    assert not config_mod.tma_default(MoDAShape(B=1, T=1024, Hq=256, Hk=8, d=64, L=64), torch.bfloat16)
    assert not config_mod.tma_default(MoDAShape(B=1, T=16384, Hq=512, Hk=8, d=64, L=64), torch.bfloat16)  # G=64
    g32 = config_mod.default_config(MoDAShape(B=1, T=8192, Hq=256, Hk=8, d=64, L=64), torch.bfloat16)
    assert (g32.fwd_depth, g32.block_m, g32.num_warps, g32.fwd_maxnreg, g32.block_l) == ("tma", 64, 4, 168, 32)
    g8 = config_mod.default_config(MoDAShape(B=1, T=8192, Hq=64, Hk=8, d=64, L=64), torch.bfloat16)
    assert (g8.block_m, g8.num_warps, g8.fwd_maxnreg) == (64, 4, 0)
    config_mod.check_config(g32, 32)
    with pytest.raises(ValueError, match="fwd_maxnreg"):
        config_mod.check_config(g32.replace(fwd_maxnreg=300), 32)
    monkeypatch.setattr(config_mod, "_capability", lambda idx: 8)
    assert not config_mod.tma_default(shape, torch.bfloat16)


def test_tma_depth_utilization():
    """S positions x BL = block_l // S entries a step: at G=8, L=64, block_l=32 the batched tile
    computes 2x the useful logits (utilisation 1/2), as the pointer kernel does; an L that is not
    a multiple of BL pays its last step in full."""
    cfg = _tma(block_m=128, block_n=64, block_l=32)
    assert depth_utilization(4096, 8, 128, 64, cfg) == pytest.approx(0.5)
    assert depth_utilization(4096, 8, 128, 20, cfg) == pytest.approx(0.5 * 20 / 32)


# ------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("rows", [64, 128], ids=["64x4w", "128x8w"])
@pytest.mark.parametrize("T,G,L", [(1000, 8, 64), (4099, 2, 256), (777, 1, 0), (333, 16, 1)])
def test_gpu_tma_bf16(T, G, L, rows):
    """The tma forward's tiles at realistic odd sizes, the default's (64 rows on 4 warps) and the
    earlier default's (128 on 8), out and gradients against an fp32 reference (the backward runs
    on its o, lse)."""
    cfg = config_mod.default_config(MoDAShape(B=1, T=T, Hq=8 * G, Hk=8, d=64, L=L), torch.bfloat16)
    bm = max(rows, config_mod.group_pad(G))
    cfg = cfg.replace(fwd_depth="tma", block_m=bm, block_n=64, num_warps=rows // 16, num_stages=3,
                      block_l=config_mod.tma_block_l(G, bm, 256, 32))
    errs = check_against_reference(_moda_lse, 1, T, 8 * G, 8, 64, L, torch.bfloat16, ref_dtype=torch.float32,
                                   config=cfg)
    print(f"tma T={T} G={G} L={L} rel errors: " + ", ".join(f"{k}={v:.2e}" for k, v in errs.items()))


def test_bwd_tma_launches_with_descriptors(monkeypatch):
    """bwd_tma=True launches both backward passes with DESC=True where they can take it (the
    key-major pass only when bwd_kv_block_m is a multiple of GP), and False without it."""
    seen = []

    class Spy:
        def __init__(self, name, fn):
            self.name, self.fn = name, fn

        def __getitem__(self, grid):
            launch = self.fn[grid]
            return lambda *a, **k: seen.append((self.name, k.get("DESC"))) or launch(*a, **k)

    monkeypatch.setattr(kernel_mod._BWD_Q_PTR, "fn", Spy("q", kernel_mod.moda_bwd_q_kernel))  # their CachedLaunch
    monkeypatch.setattr(kernel_mod._BWD_KV_PTR, "fn", Spy("kv", kernel_mod.moda_bwd_kv_kernel))
    q, k, v, _, _, _ = random_inputs(1, 19, 8, 2, 32, 0, torch.float32)
    for x in (q, k, v):
        x.requires_grad_(True)
    for cfg, want in ((MoDAConfig(bwd_tma=True, bwd_kv_block_m=32), [("q", True), ("kv", True)]),
                      (MoDAConfig(bwd_tma=True, bwd_kv_block_m=16, bwd_q_block_m=16), [("q", True), ("kv", True)]),
                      (MoDAConfig(bwd_tma=False), [("q", False), ("kv", False)])):
        seen.clear()
        moda_attention(q, k, v, config=cfg).sum().backward()
        assert seen == want, (cfg, seen)
    seen.clear()
    q2, k2, v2, _, _, _ = random_inputs(1, 19, 64, 2, 32, 0, torch.float32)  # G=32: bwd_kv_block_m=16 < GP
    q2.requires_grad_(True)
    moda_attention(q2, k2, v2, config=MoDAConfig(bwd_tma=True, bwd_kv_block_m=16, bwd_q_block_m=32,
                                                  block_m=32)).sum().backward()
    assert seen == [("q", True), ("kv", False)]
