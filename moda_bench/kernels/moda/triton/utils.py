"""Small pieces shared by the Triton kernels: the dot-product precision, a launch's warps, stages
and register cap (`launch_options`), the addressing that the fused kernel's forward and
backward passes share (folded rows `row_ptrs`, depth sub-tiles `depth_tile`, the causal key range
of a block `key_span`), and 2**x on the FMA pipe for a share of a tile (`exp2_fma`, `exp2_mix`:
`MoDAConfig.exp_poly`, an ablation measured slower on the H100, docs/PERFORMANCE.md row 32).

`dot_precision(dtype)` picks the `PREC` constexpr every kernel passes to `mm` / `mm_acc`:
- "ieee" for float32 inputs (true fp32 products; tf32 would cost ~3e-4 relative error),
- "tf32" (ignored by tl.dot for 16-bit inputs) for bf16/fp16,
- "upcast" under TRITON_INTERPRET=1: the CPU interpreter of triton 3.9 returns garbage for
  bf16 `tl.dot` operands (seen here: 16x16 product off by 1e10), so operands are converted to
  fp32 first. The conversion is exact, so the interpreter still tests bf16 rounding of the
  stored operands (p, ds cast to bf16 before their products), like the GPU path.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def launch_options(warps: int, stages: int, maxnreg: int = 0) -> dict:
    """num_warps, num_stages and, unless 0 or interpreting, maxnreg (registers a thread) of a launch."""
    meta = dict(num_warps=warps, num_stages=stages)
    if maxnreg and not interpreting():
        meta["maxnreg"] = maxnreg
    return meta


def dot_precision(dtype: torch.dtype) -> str:
    if interpreting():
        return "upcast"
    return "ieee" if dtype == torch.float32 else "tf32"


@triton.jit
def mm(a, b, PREC: tl.constexpr):
    """tl.dot(a, b) with fp32 accumulation (2-D or batched 3-D operands)."""
    if PREC == "upcast":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=PREC)


@triton.jit
def mm_acc(a, b, acc, PREC: tl.constexpr):
    """acc + a @ b with fp32 accumulation into acc (None: a fresh accumulator); 2-D operands."""
    if PREC == "upcast":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc, input_precision=PREC)


@triton.jit
def row_ptrs(base, b, j, rows, offs_d, G, sb, st, sh, GP: tl.constexpr):
    """Pointers [rows, d] into a (B, T, Hq, d) tensor for folded rows r = t*GP + g of KV head j."""
    t = rows // GP
    g = rows % GP
    return base + b * sb + t[:, None] * st + (j * G + g)[:, None] * sh + offs_d[None, :]


@triton.jit
def depth_base(t_lo, sdt):
    """The 64-bit element offset of position t_lo's depth entries (stride sdt a position):
    what `depth_tile`'s offsets are relative to."""
    return t_lo.to(tl.int64) * sdt


@triton.jit
def depth_tile(t_lo, f0, T, L, sdt, sdl, NB: tl.constexpr, S: tl.constexpr, R: tl.constexpr, GP: tl.constexpr,
               BLOCK_L: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Depth step f0 of a block whose first position is t_lo, cut into NB sub-tiles of S positions.

    Returns (offs [NB, BLOCK_L, d] element offsets of the depth entries relative to position
    t_lo's first entry, ld_ok [NB, BLOCK_L, 1] load mask, own [NB, R, BLOCK_L] score mask). A
    caller adds `depth_base(t_lo, sdt)` to its (b, KV head) base first: t_lo * sdt passes 2**31
    (T = 64K, L = 64, Hk = 8, d = 128), so it is a 64-bit scalar, while offs, below a block's
    positions x sdt, stay 32-bit (64-bit tensors of offsets spilled registers in the kernels).
    Flat column f (0 <= f < S*L) of sub-tile nb is depth entry f % L of position
    t_lo + nb*S + f // L; row rr of the sub-tile belongs to position t_lo + nb*S + rr // GP.
    """
    offs_d = tl.arange(0, HEAD_DIM)
    f = f0 + tl.arange(0, BLOCK_L)
    nb = tl.arange(0, NB)
    # load side [NB, BLOCK_L, 1]
    f_l = f[None, :, None]
    rel_l = nb[:, None, None] * S + f_l // L
    ld_ok = (f_l < S * L) & (t_lo + rel_l < T)
    offs = rel_l * sdt + (f_l % L) * sdl + offs_d[None, None, :]
    # score side [NB, R, BLOCK_L]
    f_s = f[None, None, :]
    pos_s = t_lo + nb[:, None, None] * S + f_s // L
    rr = tl.arange(0, R)[None, :, None]
    own = ((rr // GP) == (f_s // L)) & (f_s < S * L) & (pos_s < T)
    return offs, ld_ok, own


@triton.jit
def key_span(K, V, b, j, skb, skh, svb, svh, t_lo, T, P: tl.constexpr, BLOCK_N: tl.constexpr):
    """The sequence keys of a block of P positions from t_lo, for (b, KV head j): (kbase, vbase,
    n_full, t_end). Key tiles [0, n_full) lie entirely below the block's first position (no
    mask needed); tiles [n_full, t_end) reach the causal diagonal."""
    return K + b * skb + j * skh, V + b * svb + j * svh, (t_lo // BLOCK_N) * BLOCK_N, tl.minimum(t_lo + P, T)


@triton.jit
def lse_merge(l1, l2):
    """Two softmax partials with log-sum-exps l1 and l2: the weights of their outputs in the
    merged output, and the merged log-sum-exp."""
    m = tl.maximum(l1, l2)
    w1 = tl.exp(l1 - m)
    w2 = tl.exp(l2 - m)
    tot = w1 + w2
    return w1 / tot, w2 / tot, m + tl.log(tot)


def exp_poly_share(exp_poly: int, bit: int, dtype) -> int:
    """A pass's `exp2_mix` POLY from `MoDAConfig.exp_poly` (bit 1 forward, 2 dq pass, 4 key-major
    pass): 2 where the bit is set and the inputs are 16-bit (float32 keeps the exponential unit), else 0."""
    return 2 if exp_poly & bit and dtype != torch.float32 else 0


@triton.jit
def exp2_fma(x):
    """2**x on the FMA pipe, not the exponential unit: x = n + f with n = round(x) (the 1.5 * 2**23
    shift, no conversion instruction) and f in [-1/2, 1/2], 2**f by a degree-3 polynomial (relative
    error 7.6e-5, below bf16's 3.9e-3), n added to the result's exponent bits. x is clamped at -126,
    so that the exponent cannot wrap: below it the result is 0 or subnormal (< 2**-125), where
    exp2 gives about 0 too. For the probabilities of 16-bit attention only (x <= 0 there)."""
    x = tl.maximum(x, -126.0)
    t = x + 12582912.0
    f = x - (t - 12582912.0)
    p = 0.05517086386680603 * f + 0.2426091432571411
    p = p * f + 0.6932609677314758
    p = p * f + 0.9999281764030457
    return (p.to(tl.int32, bitcast=True) + (t.to(tl.int32, bitcast=True) << 23)).to(tl.float32, bitcast=True)


@triton.jit
def exp2_mix(x, POLY: tl.constexpr):
    """2**x of a 2-D tile with a share of the elements on the FMA pipe (`exp2_fma`) and the rest on
    the exponential unit, which at d=64 is as busy as the tensor cores: POLY = 0 none, 2 every
    second column (a thread's column pairs of the MMA layout, split and joined in registers)."""
    if POLY == 0:
        return tl.math.exp2(x)
    else:
        tl.static_assert(POLY == 2, "exp2_mix: POLY is 0 or 2")
        R: tl.constexpr = x.shape[0]
        C: tl.constexpr = x.shape[1]
        a, b = tl.split(tl.reshape(x, (R, C // 2, 2)))
        return tl.reshape(tl.join(tl.math.exp2(a), exp2_fma(b)), (R, C))
