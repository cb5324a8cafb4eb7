"""`triton_utils.exp2_fma` / `exp2_mix` (2**x on the FMA pipe for a share of a tile) and the
descriptor kernels with `MoDAConfig.exp_poly`: the polynomial against float64 exp2 over the range
softmax exponents take (relative error below 1e-4 from -125 to 0, never negative, about 0 below),
the mixed tile column by column, and MoDA's forward and five gradients with every pass mixed
(exp_poly=7) against the fp64 reference at odd T, G in {1, 3, 8, 16}, L in {0, 1, 5}, bf16;
bitwise unchanged on float32 inputs (which keep the exponential unit); the config check.

CPU: the Triton interpreter (conftest sets TRITON_INTERPRET=1). Tolerances: the polynomial's
stated 7.6e-5 (checked at 1e-4); helpers.TOLERANCE for the kernels (bf16 2e-2), and 1e-2 between
exp_poly=7 and 0 on the same bf16 inputs (they differ by rounding of the bf16 probabilities).
"""
import pytest
import torch
import triton
import triton.language as tl
from helpers import check_against_reference, device, random_inputs, rel_err

from moda_bench.kernels.moda import MoDAConfig, moda_attention
from moda_bench.kernels.moda.config import check_config
from moda_bench.kernels.moda.triton.utils import exp2_fma, exp2_mix


@triton.jit
def _exp_kernel(X, Y, Z, R: tl.constexpr, C: tl.constexpr):
    offs = tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
    x = tl.load(X + offs)
    tl.store(Y + offs, exp2_fma(x))
    tl.store(Z + offs, exp2_mix(x, 2))


def _run(x):
    y, z = torch.empty_like(x), torch.empty_like(x)
    _exp_kernel[(1,)](x, y, z, R=x.shape[0], C=x.shape[1])
    return y, z


def test_exp2_fma_accuracy_and_range():
    dev = device()
    x = torch.linspace(-125.0, 0.25, 64 * 64, dtype=torch.float32, device=dev).reshape(64, 64)
    y, z = _run(x)
    ref = torch.exp2(x.double())
    assert ((y.double() / ref - 1).abs().max()) < 1e-4
    # the mixed tile: even columns by the exponential unit, odd ones by the polynomial
    assert ((z.double() / ref - 1).abs().max()) < 1e-4
    assert torch.equal(z[:, 1::2], y[:, 1::2])
    assert torch.allclose(z[:, 0::2].double(), ref[:, 0::2], rtol=1e-6, atol=0)
    # far below: clamped, never negative or wrapped through the sign bit, at most 2**-125
    low = torch.tensor([-126.0, -126.4, -126.6, -127.0, -200.0, -1e30, float("-inf")] + [-130.0] * 9,
                       dtype=torch.float32, device=dev).reshape(8, 2)
    yl, _ = _run(low)
    assert (yl >= 0).all() and (yl <= 2.0 ** -125).all()
    # exact powers of two stay exact
    ints = torch.arange(-62, 2, dtype=torch.float32, device=dev).reshape(16, 4)
    yi, _ = _run(ints)
    assert torch.allclose(yi.double(), torch.exp2(ints.double()), rtol=1e-4, atol=0)


def _both(**kw):
    """The descriptor forward and the folded backward with small tiles (several blocks and steps)."""
    base = dict(fwd_depth="tma", block_m=32, block_n=16, block_l=16, bwd_depth="tma", bwd_q_block_m=32,
                bwd_q_block_n=16, bwd_kv_block_m=32, bwd_kv_block_n=16, bwd_block_l=16, bwd_q_stages=2,
                bwd_kv_stages=2)
    return MoDAConfig(**dict(base, **kw))


def _moda_lse(*args, **kw):
    return moda_attention(*args, return_lse=True, **kw)


# (B, T, G, L, config)
CASES = [
    (2, 37, 8, 5, _both(exp_poly=7)),
    (1, 50, 16, 0, _both(exp_poly=7, block_n=32)),
    (2, 29, 3, 1, _both(exp_poly=7, block_m=16, bwd_q_block_m=16, bwd_kv_block_m=16)),
    (1, 33, 1, 3, _both(exp_poly=7, block_l=32, bwd_block_l=32)),
]


@pytest.mark.parametrize("B,T,G,L,cfg", CASES, ids=[f"T{c[1]}-G{c[2]}-L{c[3]}" for c in CASES])
def test_exp_poly_forward_and_gradients_bf16(B, T, G, L, cfg):
    check_against_reference(_moda_lse, B, T, G * 2, 2, 32, L, torch.bfloat16, seed=T + G + L, config=cfg)


def _grads(cfg, inputs, do):
    ins = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = moda_attention(*ins, config=cfg)
    out.backward(do)
    return [out] + [x.grad for x in ins]


@pytest.mark.parametrize("bits", [1, 2, 4])
def test_exp_poly_each_pass_close_to_the_exponential_unit(bits):
    """One pass mixed at a time (bf16): out and gradients within rounding of the unmixed kernels."""
    q, k, v, kd, vd, do = random_inputs(1, 41, 16, 2, 32, 5, torch.bfloat16, seed=bits)
    ref = _grads(_both(), (q, k, v, kd, vd), do)
    mixed = _grads(_both(exp_poly=bits), (q, k, v, kd, vd), do)
    for a, b in zip(mixed, ref):
        assert rel_err(a, b) < 1e-2


def test_exp_poly_float32_unchanged():
    """float32 inputs keep the exponential unit: exp_poly changes nothing, bitwise."""
    q, k, v, kd, vd, do = random_inputs(1, 35, 8, 2, 32, 3, torch.float32, seed=5)
    for a, b in zip(_grads(_both(exp_poly=7), (q, k, v, kd, vd), do), _grads(_both(), (q, k, v, kd, vd), do)):
        assert torch.equal(a, b)


def test_exp_poly_config_check():
    check_config(MoDAConfig(exp_poly=7), 8)
    for bad in (-1, 8, 16):
        with pytest.raises(ValueError, match="exp_poly"):
            check_config(MoDAConfig(exp_poly=bad), 8)


@pytest.mark.gpu
@pytest.mark.parametrize("T,G,L", [(1000, 8, 64), (4099, 8, 3), (333, 2, 0), (4099, 16, 0)])
def test_gpu_exp_poly_default_tiles(T, G, L):
    """The Hopper default with every pass mixed (exp_poly=7) against the fp64 reference, bf16:
    out, lse and all five gradients (capped registers above T=4096)."""
    from moda_bench.kernels.moda.config import default_config
    from moda_bench.kernels.moda.validate import MoDAShape
    cfg = default_config(MoDAShape(1, T, G * 2, 2, 64, L), torch.bfloat16).replace(exp_poly=7)
    check_against_reference(_moda_lse, 1, T, G * 2, 2, 64, L, torch.bfloat16, seed=T + G + L, config=cfg)
