"""The fused MoDA kernel (moda_attention) against the fp64 dense reference.

On a CPU machine the Triton kernels run under TRITON_INTERPRET=1 (set in conftest.py) at
small sizes; GPU-marked tests run realistic sizes on CUDA. Tolerances: helpers.TOLERANCE
(||err|| / ||ref||: fp32 1e-4, fp16 5e-3, bf16 2e-2).
"""
import itertools

import pytest
import torch
from helpers import check_against_reference, random_inputs, rel_err

from moda_bench.kernels.moda import MoDAConfig, depth_utilization, moda_attention, moda_reference


def _moda_lse(*args, **kw):
    return moda_attention(*args, return_lse=True, **kw)


GRID = list(itertools.product([1, 7, 33, 100], [1, 2, 4, 8], [0, 1, 3, 16]))


@pytest.mark.parametrize("T,G,L", GRID, ids=[f"T{t}-G{g}-L{l}" for t, g, l in GRID])
def test_grid_fp32(T, G, L):
    """Every (T, G, L) of the issue's grid, forward (out, lse) and all five gradients."""
    B = 2 if (T + G + L) % 2 else 1
    Hk = 2 if T <= 7 else 1
    check_against_reference(_moda_lse, B, T, G * Hk, Hk, 32, L, torch.float32, seed=T * 100 + G * 10 + L)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("B,T,G,L", [(2, 33, 4, 3), (1, 100, 8, 16), (2, 7, 1, 1), (1, 33, 2, 0)])
def test_dtypes_d64(dtype, B, T, G, L):
    check_against_reference(_moda_lse, B, T, G * 2, 2, 64, L, dtype, seed=B + T + G + L)


def test_head_dim_128():
    check_against_reference(_moda_lse, 1, 33, 4, 2, 128, 3, torch.float32, seed=3)


@pytest.mark.parametrize("G", [3, 6, 16])
def test_group_sizes_not_power_of_two_or_large(G):
    """G=3, 6 pad rows to GP=4, 8 (masked rows); G=16 fills a tensor-core tile per position."""
    check_against_reference(_moda_lse, 1, 21, G, 1, 32, 5, torch.float32, seed=G)


@pytest.mark.parametrize("cfg", [
    MoDAConfig(block_m=64, depth_sub=8, block_l=16, bwd_q_block_m=64, fwd_depth="fused",
               bwd_depth="fused"),  # paper's dense group-aware tile
    MoDAConfig(block_m=32, block_n=16, depth_sub=4, block_l=16, bwd_q_block_m=16, bwd_q_block_n=32,
               bwd_kv_block_m=16, bwd_kv_block_n=32),  # mixed tile shapes, L not a multiple of block_l
    MoDAConfig(block_m=128, block_n=32, block_l=32, bwd_q_block_m=128, bwd_kv_block_m=32, bwd_kv_block_n=16),
], ids=["dense", "small-tiles", "wide-rows"])
def test_configs(cfg):
    check_against_reference(_moda_lse, 2, 45, 8, 2, 32, 19, torch.float32, seed=7, config=cfg)


@pytest.mark.parametrize("fwd_depth,bwd_depth", [("fused", "split"), ("split", "stream"), ("overlap", "fused"),
                                                ("stream", "overlap")])
def test_depth_placement(fwd_depth, bwd_depth):
    """Every placement of the depth work (fused / own launch / extra programs + merge) gives the
    same answer; small tiles so several programs of each role run, T not a tile multiple. The
    forward's placement and the backward's are independent (the backward reads only out and lse),
    so each appears once on each side rather than in all 16 pairs."""
    cfg = MoDAConfig(block_m=32, block_n=16, depth_block_m=16, bwd_q_block_m=32, bwd_kv_block_m=16,
                     bwd_kv_block_n=16, block_l=16, fwd_depth=fwd_depth, bwd_depth=bwd_depth,
                     reverse=fwd_depth == "split")
    check_against_reference(_moda_lse, 2, 37, 8, 2, 32, 19, torch.float32, seed=11, config=cfg)


@pytest.mark.parametrize("bwd_depth,L,launches", [("fused", 5, 0), ("fused", 0, 0), ("split", 5, 1),
                                                   ("stream", 5, 1), ("overlap", 5, 1)])
def test_delta_preprocess_only_where_needed(monkeypatch, bwd_depth, L, launches):
    """Where the q-major pass runs first (L = 0, "fused") it computes delta itself: the
    preprocessing kernel is not launched and the gradients still match the reference; the other
    placements read delta before any q-major pass and keep the launch."""
    import moda_bench.kernels.moda.triton.interface as kernel_mod
    calls = []
    real = kernel_mod._DELTA  # the delta kernel's launch (`kernel.launch_delta`)

    def counting(key, grid, args, meta):
        calls.append(grid)
        return real(key, grid, args, meta)
    monkeypatch.setattr(kernel_mod, "_DELTA", counting)
    cfg = MoDAConfig(block_m=32, block_n=16, depth_block_m=16, bwd_q_block_m=32, bwd_kv_block_m=16,
                     bwd_kv_block_n=16, block_l=16, bwd_depth=bwd_depth)
    check_against_reference(_moda_lse, 2, 37, 4, 2, 32, L, torch.float32, seed=13, config=cfg)
    assert len(calls) == launches


def _placement(mode: str) -> MoDAConfig:
    """Both passes' depth placement; 'stream-after' = side stream, launched after the sequence kernel."""
    if mode == "stream-after":
        return MoDAConfig(fwd_depth="stream", bwd_depth="stream", depth_after=True, bwd_depth_after=True)
    return MoDAConfig(fwd_depth=mode, bwd_depth=mode)


@pytest.mark.parametrize("T,G,L", [(1, 1, 1), (50, 2, 1), (33, 4, 70)])
@pytest.mark.parametrize("mode", ["split", "overlap", "stream", "stream-after"])
def test_depth_placement_bf16_edges(T, G, L, mode):
    """The partials pass through the bf16 output/dq buffers: still within bf16 tolerance."""
    cfg = _placement(mode).replace(reverse=True)
    check_against_reference(_moda_lse, 1, T, 2 * G, 2, 64, L, torch.bfloat16, seed=T + L, config=cfg)


def test_bad_depth_mode_error():
    with pytest.raises(ValueError, match="fwd_depth"):
        moda_attention(*_good(), config=MoDAConfig(fwd_depth="sideways"))


def test_scale_argument():
    q, k, v, kd, vd, _ = random_inputs(1, 19, 4, 2, 32, 3, torch.float32)
    out = moda_attention(q, k, v, kd, vd, scale=0.3)
    ref = moda_reference(q, k, v, kd, vd, scale=0.3, out_dtype=torch.float64)
    assert rel_err(out, ref) < 1e-5


def test_lse_gradient_is_not_materialised(monkeypatch):
    """With or without return_lse the backward gets None for lse's (non-differentiable) gradient,
    not a zero-filled tensor (lse is always an output of the custom op). The gradients of both
    calls are equal."""
    from moda_bench.kernels.moda.triton import interface as op_mod
    seen = []
    real = op_mod._backward  # the custom op's autograd formula
    monkeypatch.setattr(op_mod, "_backward", lambda ctx, do, dlse: seen.append(dlse) or real(ctx, do, dlse))
    q, k, v, kd, vd, do = random_inputs(1, 19, 4, 2, 32, 3, torch.float32, seed=1)
    grads = []
    for lse in (False, True):
        for x in (q, k, v, kd, vd):
            x.grad = None
        out = moda_attention(q, k, v, kd, vd, return_lse=lse)
        assert isinstance(out, tuple) == lse
        (out[0] if lse else out).backward(do)
        grads.append([x.grad.clone() for x in (q, k, v, kd, vd)])
    assert seen == [None, None]  # lse is an output of the op either way; its gradient never materialised
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_l0_is_causal_gqa():
    """L = 0 equals SDPA's causal attention with the KV heads repeated."""
    q, k, v, _, _, _ = random_inputs(2, 37, 8, 2, 32, 0, torch.float32)
    out = moda_attention(q, k, v)
    kr, vr = (x.repeat_interleave(4, dim=2).transpose(1, 2) for x in (k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2).double(), kr.double(), vr.double(),
                                                           is_causal=True).transpose(1, 2)
    assert rel_err(out, ref) < 1e-5


def test_noncontiguous_inputs():
    """Inputs given as transposed views (B, H, T, d) -> (B, T, H, d) give the same answer."""
    q, k, v, kd, vd, _ = random_inputs(1, 17, 4, 2, 32, 2, torch.float32)
    qt = q.detach().transpose(1, 2).contiguous().transpose(1, 2)
    assert not qt.is_contiguous()
    assert rel_err(moda_attention(qt, k, v, kd, vd), moda_attention(q, k, v, kd, vd)) < 1e-6


def test_depth_utilization():
    # batched tiles: G=8 -> 2 positions per 16-row tile, half of the computed logits are useful
    assert depth_utilization(4096, 8, 64, 64) == pytest.approx(0.5)
    assert depth_utilization(4096, 16, 64, 64) == pytest.approx(1.0)
    # the paper's dense group-aware tile: G / C
    dense = MoDAConfig(block_m=64, depth_sub=8)
    assert depth_utilization(4096, 8, 64, 64, dense) == pytest.approx(8 / 64)


# ------------------------------------------------------------------ errors
def _good(dtype=torch.float32):
    return random_inputs(1, 8, 4, 2, 32, 2, dtype)[:5]


@pytest.mark.parametrize("mutate,exc,words", [
    (lambda a: (a[0][0],) + a[1:], ValueError, "q must have rank 4"),
    (lambda a: (a[0][:, :, :3],) + a[1:], ValueError, "multiple of k heads"),
    (lambda a: (a[0], a[1][:, :5], a[2][:, :5]) + a[3:], ValueError, "k must have shape"),
    (lambda a: a[:3] + (a[3][:, :5], a[4][:, :5]), ValueError, "k_depth must have shape"),
    (lambda a: a[:4] + (None,), ValueError, "both be given"),
    (lambda a: (a[0].double(),) + a[1:], TypeError, "q has dtype torch.float64"),
    (lambda a: (a[0], a[1].half()) + a[2:], TypeError, "k has dtype"),
    (lambda a: (a[0][..., :24], a[1][..., :24], a[2][..., :24], a[3][..., :24], a[4][..., :24]), ValueError,
     "head dim d=24"),
    (lambda a: ("q",) + a[1:], TypeError, "q must be a torch.Tensor"),
])
def test_bad_input_errors(mutate, exc, words):
    args = mutate(_good())
    with pytest.raises(exc, match=words):
        moda_attention(*args)


def test_check_inputs_memo_answers_passing_calls_only():
    """A call like one that passed returns its MoDAShape from the memo; any call that differs in a
    shape, dtype or device (or is not tensors) still goes through every check and its error."""
    from moda_bench.kernels.moda.validate import check_inputs
    good = _good()
    first = check_inputs(*good)
    assert check_inputs(*good) is first and check_inputs(*(t.clone() for t in good)) is first
    with pytest.raises(TypeError, match="k has dtype"):
        check_inputs(good[0], good[1].half(), *good[2:])
    with pytest.raises(ValueError, match="both be given"):
        check_inputs(*good[:4], None)
    check_inputs(*good[:3], None, None)                 # an L = 0 call passes and is kept ...
    with pytest.raises(ValueError, match="both be given"):
        check_inputs(*good[:3], None, good[4])          # ... and half a pair is never its memo's answer
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        check_inputs(good[0].tolist(), *good[1:])


def test_bad_config_error():
    with pytest.raises(ValueError, match="block_m"):
        moda_attention(*_good(), config=MoDAConfig(block_m=48))


def test_cpu_tensors_rejected_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v, kd, vd = (x.cpu() for x in _good())
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        moda_attention(q, k, v, kd, vd)


# ------------------------------------------------------------------ GPU, realistic sizes
@pytest.mark.gpu
@pytest.mark.parametrize("T,G,L", [(4096, 8, 64), (1000, 8, 64), (2048, 2, 256), (777, 1, 0)])
def test_gpu_realistic_bf16(T, G, L):
    """bf16 vs an fp32 reference on the GPU (fp64 would be slow at this size)."""
    errs = check_against_reference(_moda_lse, 1, T, 8 * G, 8, 64, L, torch.bfloat16, ref_dtype=torch.float32)
    print(f"T={T} G={G} L={L} rel errors: " + ", ".join(f"{k}={v:.2e}" for k, v in errs.items()))


@pytest.mark.gpu
def test_gpu_fp16_d128():
    check_against_reference(_moda_lse, 2, 1111, 16, 4, 128, 32, torch.float16, ref_dtype=torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["fused", "split", "overlap", "stream", "stream-after"])
def test_gpu_depth_placement_bf16(mode):
    """Each depth placement at a realistic size (many programs of each role in flight at once;
    on the GPU the side-stream launches really run concurrently)."""
    cfg = _placement(mode)
    errs = check_against_reference(_moda_lse, 1, 4096, 64, 8, 64, 64, torch.bfloat16, ref_dtype=torch.float32,
                                   config=cfg)
    print(f"{mode}: " + ", ".join(f"{k}={v:.2e}" for k, v in errs.items()))
