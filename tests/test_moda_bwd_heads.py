"""The "tma" backward's dq pass a query head a program (`kernel_bwd_tma._dq_head_kernel`, L = 0, G a
power of two above 1; `MoDAConfig.bwd_dq_heads`, `kernel_bwd_rules.dq_heads`): against the fp64
reference at odd T (not a multiple of its blocks), T shorter than a block, G 2 / 4 / 8 / 16 / 32,
B = 2, key-major steps that read rows past T (its tail of +inf rows), fp32 and bf16; the same
gradients as the folded dq pass; descriptor and pointer loads; the rule and its limits.

CPU: the Triton interpreter runs the device-side descriptors (conftest sets TRITON_INTERPRET=1).
Tolerances: helpers.TOLERANCE (||err|| / ||ref||: fp32 1e-4, bf16 2e-2); same-answer checks 1e-5.
"""
import pytest
import torch
from helpers import check_against_reference, random_inputs, rel_err

from moda_bench.kernels.moda import MoDAConfig, moda_attention
from moda_bench.kernels.moda.triton import bwd_tma as kernel_bwd_tma
from moda_bench.kernels.moda.triton import interface as kernel_mod
from moda_bench.kernels.moda.triton.bwd_tma_rules import DQ_HEADS_MIN_T, DQ_HEADS_MIN_T_G2, dq_heads


def _heads(**kw):
    """A "tma" backward with small tiles and the per-head dq pass forced on."""
    base = dict(bwd_depth="tma", bwd_q_block_m=32, bwd_q_block_n=16, bwd_kv_block_m=32, bwd_kv_block_n=16,
                bwd_q_stages=2, bwd_kv_stages=2, bwd_dq_heads=1)
    return MoDAConfig(**dict(base, **kw))


def _moda_lse(*args, **kw):
    return moda_attention(*args, return_lse=True, **kw)


# (B, T, G, d, config)
CASES = [
    (2, 37, 8, 32, _heads()),                                               # odd T, 2 blocks a head, B=2
    (1, 50, 16, 32, _heads()),                                              # G=16
    (2, 53, 2, 32, _heads(bwd_kv_block_n=64, bwd_q_block_n=32)),            # G=2, one key tile a block
    (1, 7, 4, 32, _heads(bwd_q_block_m=16, bwd_kv_block_m=16)),             # T shorter than a block
    (1, 19, 32, 32, _heads(bwd_q_block_m=32, bwd_kv_block_m=32)),           # G=32
    (1, 40, 2, 32, _heads(bwd_kv_block_m=64, bwd_kv_block_n=32)),           # key-major steps past T: tail rows
    (1, 45, 8, 64, _heads(bwd_q_block_m=64, bwd_q_block_n=64, bwd_kv_block_m=64, bwd_kv_block_n=64)),  # default tiles
]


@pytest.mark.parametrize("B,T,G,d,cfg", CASES, ids=[f"T{c[1]}-G{c[2]}-d{c[3]}-{i}" for i, c in enumerate(CASES)])
def test_dq_heads_against_reference_fp32(B, T, G, d, cfg, monkeypatch):
    launched = _count_head_launches(monkeypatch)
    check_against_reference(_moda_lse, B, T, G * 2, 2, d, 0, torch.float32, seed=T + G, config=cfg)
    assert launched, "the per-head dq pass did not run"


@pytest.mark.parametrize("T,G", [(61, 8), (33, 4)])
def test_dq_heads_against_reference_bf16(T, G):
    check_against_reference(_moda_lse, 1, T, G, 1, 64, 0, torch.bfloat16, seed=T,
                            config=_heads(bwd_q_block_m=64, bwd_q_block_n=64, bwd_kv_block_m=64, bwd_kv_block_n=64))


def _count_head_launches(monkeypatch) -> list:
    calls = []
    real = kernel_bwd_tma._DQH_LAUNCH
    monkeypatch.setattr(kernel_bwd_tma, "_DQH_LAUNCH", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def _grads(cfg, inputs, do):
    ins = [x.detach().clone().requires_grad_(True) for x in inputs]
    moda_attention(*ins, config=cfg).backward(do)
    return [x.grad for x in ins]


@pytest.mark.parametrize("aligned", [True, False], ids=["descriptors", "pointers"])
def test_dq_heads_same_gradients_as_folded(monkeypatch, aligned):
    """Per head or folded, a row's dq sums the same products: equal to rounding; dk, dv read the
    same row statistics. Pointer loads (unaligned inputs) give the same answer."""
    if not aligned:
        monkeypatch.setattr(kernel_mod, "aligned", lambda *t, **kw: False)
    q, k, v, _, _, do = random_inputs(2, 43, 8, 2, 32, 0, torch.float32, seed=3)
    folded = _grads(_heads(bwd_dq_heads=0), (q, k, v), do)
    launched = _count_head_launches(monkeypatch)
    heads = _grads(_heads(), (q, k, v), do)
    assert launched
    for a, b in zip(heads, folded):
        assert rel_err(a, b) < 1e-5


def test_dq_heads_rule():
    """-1: from DQ_HEADS_MIN_T on (G = 2: DQ_HEADS_MIN_T_G2); 1 / 0 force it; never with depth, G = 1
    or a G that is not a power of two."""
    cfg = MoDAConfig(bwd_depth="tma")
    assert dq_heads(cfg, DQ_HEADS_MIN_T, 0, 8) and not dq_heads(cfg, DQ_HEADS_MIN_T - 1, 0, 8)
    assert dq_heads(cfg, DQ_HEADS_MIN_T_G2, 0, 2) and not dq_heads(cfg, DQ_HEADS_MIN_T_G2 - 1, 0, 2)
    assert dq_heads(cfg, DQ_HEADS_MIN_T, 0, 4)
    assert dq_heads(cfg.replace(bwd_dq_heads=1), 64, 0, 2)
    assert not dq_heads(cfg.replace(bwd_dq_heads=0), 65536, 0, 8)
    for L, G in ((64, 8), (1, 8), (0, 1), (0, 3), (0, 6)):
        assert not dq_heads(cfg.replace(bwd_dq_heads=1), 65536, L, G)


def test_dq_heads_not_applied_where_it_cannot_run(monkeypatch):
    """Forced on with depth or a padded group the folded pass runs instead (still correct); asked of
    `moda_bwd_tma` directly there, its plan refuses."""
    launched = _count_head_launches(monkeypatch)
    check_against_reference(_moda_lse, 1, 21, 6, 2, 32, 3, torch.float32, seed=1, config=_heads())  # G=3, L=3
    assert not launched
    q, k, v, kd, vd, do = random_inputs(1, 16, 4, 2, 32, 2, torch.float32, seed=2)
    o, lse = moda_attention(q, k, v, kd, vd, return_lse=True)
    with pytest.raises(ValueError, match="a query head a program"):
        kernel_bwd_tma.moda_bwd_tma(do, q, k, v, kd, vd, o.detach(), lse.detach(), 32 ** -0.5, 2, heads=True)


def test_dq_heads_config_check():
    with pytest.raises(ValueError, match="bwd_dq_heads=2"):
        moda_attention(*random_inputs(1, 8, 4, 2, 32, 0, torch.float32)[:3], config=_heads(bwd_dq_heads=2))


@pytest.mark.gpu
@pytest.mark.parametrize("T,G", [(8195, 8), (DQ_HEADS_MIN_T_G2 + 77, 2), (DQ_HEADS_MIN_T + 1, 16)])
def test_gpu_dq_heads_by_the_rule(T, G, monkeypatch):
    """The heuristic default at L = 0 where the rule takes the per-head dq pass (64 x 64 tiles, 4 warps;
    the 168-register cap above T = 4096): out, lse and the three gradients against the fp64 reference, bf16."""
    launched = _count_head_launches(monkeypatch)
    check_against_reference(_moda_lse, 1, T, G, 1, 64, 0, torch.bfloat16, seed=T)
    assert launched
