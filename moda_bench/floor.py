"""The floor of every row: useful FLOPs, minimum HBM bytes, and the time no implementation of
that provider's function can beat on this GPU.

    floor_ms = max(flops / matmul rate, bytes / copy rate)

with both rates from the run's own health canary (`moda_bench.health`: a bf16 8192^3 matmul and
a 1 GiB device copy counted read + write), recorded in `run.json`. `of_floor` = median_ms /
floor_ms says how far a row is from it; `gbps` = bytes / median is the traffic it reached.

The model (e = bytes per element of the dtype; `docs/FLOOR.md` works the base point through):

* MoDA, training (`moda_work`), per pass. Forward: read q, k, v, k_depth, v_depth once, write
  out and lse (fp32). Backward: read q, k, v, out, dout, lse and the depth K/V once, write dq,
  dk, dv and, unless the depth is detached (depth_grad off), dk_depth and dv_depth. fwdbwd is
  the sum: the depth K/V is read twice and its gradients written once. FLOPs: the spec's
  sequence 4 B Hq d T(T+1)/2 and depth 4 B Hq d T L per forward; the backward is 2.5x for the
  sequence part and for the depth part with gradients (five matmuls of the forward's two), 1.5x
  for a detached depth part (scores, dP and dq only).
* Sequence-only attention: MoDA with L = 0.
* Depth-Attention (`dattn_work`): the depth mix (read q, k, v and the S source K/V, write the
  mixed V; backward: read those and the mixed V's gradient, write the gradients of all five)
  plus causal attention (L = 0) on the mixed values. Mix FLOPs 4 B T Hk d (S + 1) forward,
  twice that backward.
* Decode (`decode_work`): read q, each sequence's n_b cached keys and values, the new tokens'
  depth K/V, write out. FLOPs 4 Hq d per (query row, key) pair actually attended.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

# bytes per element of the dtype names the `dtype` column holds
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
LSE_BYTES = 4   # lse / delta rows are float32

# what a provider computes, for its FLOP and byte model (bench.providers sets it per provider)
KINDS = ("moda", "sequence", "dattn", "mix", "decode", "decode-sequence")


@dataclass(frozen=True)
class Work:
    """Useful FLOPs and minimum HBM bytes of one call of a pass."""

    flops: float
    bytes: float

    def __add__(self, other: "Work") -> "Work":
        return Work(self.flops + other.flops, self.bytes + other.bytes)


@dataclass(frozen=True)
class Rates:
    """The two ceilings a floor is computed with: bf16 matmul TFLOP/s and device copy GB/s (read +
    write), and where they came from ('canary' of this run, 'table: <GPU>' or 'none')."""

    matmul_tflops: float = math.nan
    copy_gbps: float = math.nan
    source: str = "none"

    def known(self) -> bool:
        return self.matmul_tflops > 0 and self.copy_gbps > 0

    def as_dict(self) -> dict:
        return {"matmul_tflops": self.matmul_tflops, "copy_gbps": self.copy_gbps, "source": self.source}


def elem_bytes(dtype) -> int:
    """Bytes per element of a `dtype` column value, or an element size given as an int (ValueError
    for an unknown name)."""
    if isinstance(dtype, int) and not isinstance(dtype, bool) and dtype > 0:
        return dtype
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"no byte size for dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}") from None


def _check_pass(pass_: str, allowed: Sequence[str]) -> None:
    if pass_ not in allowed:
        raise ValueError(f"pass must be one of {', '.join(allowed)} here, got {pass_!r}")


def moda_work(pass_: str, B: int, T: int, Hq: int, Hk: int, d: int, L: int, *, dtype: str = "bfloat16",
              depth_grad: bool = True) -> Work:
    """FLOPs and bytes of MoDA (L = 0: causal GQA attention) for 'fwd', 'bwd' or 'fwdbwd'."""
    _check_pass(pass_, ("fwd", "bwd", "fwdbwd"))
    e = elem_bytes(dtype)
    q = B * T * Hq * d * e              # q, out, dout, dq: one each
    kv = B * T * Hk * d * e             # k, v, dk, dv: one each
    depth = B * T * L * Hk * d * e      # k_depth, v_depth, and their gradients: one each
    lse = B * T * Hq * LSE_BYTES
    seq_f = 4.0 * B * Hq * d * T * (T + 1) / 2
    depth_f = 4.0 * B * Hq * d * T * L
    fwd = Work(seq_f + depth_f, 2 * q + 2 * kv + 2 * depth + lse)
    grads = 2 * depth if (depth_grad and L) else 0
    bwd = Work(2.5 * seq_f + (2.5 if depth_grad else 1.5) * depth_f,
               3 * q + 2 * kv + lse + 2 * depth + q + 2 * kv + grads)
    return {"fwd": fwd, "bwd": bwd, "fwdbwd": fwd + bwd}[pass_]


def mix_work(pass_: str, B: int, T: int, Hq: int, Hk: int, d: int, S: int, *, dtype: str = "bfloat16") -> Work:
    """The Depth-Attention mix alone: qbar from q, S + 1 logits and a weighted sum of S + 1 values
    per (token, KV head); backward: the gradients of q (its share), k, v, k_src, v_src."""
    _check_pass(pass_, ("fwd", "bwd", "fwdbwd"))
    e = elem_bytes(dtype)
    q = B * T * Hq * d * e
    kv = B * T * Hk * d * e
    src = B * T * S * Hk * d * e
    f = 4.0 * B * T * Hk * d * (S + 1)
    fwd = Work(f, q + 2 * kv + 2 * src + kv)                     # read q, k, v, sources; write mixed v
    bwd = Work(2 * f, kv + q + 2 * kv + 2 * src + q + 2 * kv + 2 * src)  # + d(mixed v) read, 5 gradients written
    return {"fwd": fwd, "bwd": bwd, "fwdbwd": fwd + bwd}[pass_]


def dattn_work(pass_: str, B: int, T: int, Hq: int, Hk: int, d: int, S: int, *, dtype: str = "bfloat16") -> Work:
    """Depth-Attention: the mix, then causal attention (L = 0) on the mixed values."""
    return mix_work(pass_, B, T, Hq, Hk, d, S, dtype=dtype) + moda_work(pass_, B, T, Hq, Hk, d, 0, dtype=dtype)


def decode_work(B: int, T: int, Tq: int, Hq: int, Hk: int, d: int, L: int, *, dtype: str = "bfloat16",
                seqlens: Optional[Sequence[int]] = None) -> Work:
    """One decode step: the Tq newest tokens of B sequences over caches of seqlens[b] tokens
    (default T each), each token also attending to its own L depth entries."""
    e = elem_bytes(dtype)
    n = list(seqlens) if seqlens is not None else [T] * B
    if len(n) != B:
        raise ValueError(f"seqlens has {len(n)} entries for B={B}")
    keys = sum(Tq * (nb - Tq) + Tq * (Tq + 1) / 2 + Tq * L for nb in n)   # (row, key) pairs per head
    flops = 4.0 * Hq * d * keys
    nbytes = (2 * B * Tq * Hq * d + 2 * sum(n) * Hk * d + 2 * B * Tq * L * Hk * d) * e
    return Work(flops, nbytes)


def row_work(kind: str, pass_: str, *, B: int, T: int, Hq: int, Hk: int, d: int, L: int = 0, S: int = 0,
             Tq: int = 0, dtype: str = "bfloat16", depth_grad: bool = True) -> Work:
    """The Work of a row whose provider computes `kind` (KINDS) in pass `pass_`."""
    if kind == "moda":
        return moda_work(pass_, B, T, Hq, Hk, d, L, dtype=dtype, depth_grad=depth_grad)
    if kind == "sequence":
        return moda_work(pass_, B, T, Hq, Hk, d, 0, dtype=dtype)
    if kind == "dattn":
        return dattn_work(pass_, B, T, Hq, Hk, d, S, dtype=dtype)
    if kind == "mix":
        return mix_work(pass_, B, T, Hq, Hk, d, S, dtype=dtype)
    if kind in ("decode", "decode-sequence"):
        _check_pass(pass_, ("decode",))
        return decode_work(B, T, max(Tq, 1), Hq, Hk, d, L if kind == "decode" else 0, dtype=dtype)
    raise ValueError(f"unknown provider kind {kind!r}; known: {', '.join(KINDS)}")


def floor_ms(work: Work, rates: Rates) -> float:
    """max(flops / matmul rate, bytes / copy rate) in ms; NaN without rates."""
    if not rates.known():
        return math.nan
    return max(work.flops / (rates.matmul_tflops * 1e9), work.bytes / (rates.copy_gbps * 1e6))


def floor_columns(work: Work, rates: Rates, median_ms: float) -> dict:
    """The row's floor columns: flops, bytes, floor_ms, of_floor (median / floor), gbps."""
    fl = floor_ms(work, rates)
    ok = median_ms is not None and median_ms == median_ms and median_ms > 0
    return {"flops": work.flops, "bytes": work.bytes, "floor_ms": fl,
            "of_floor": median_ms / fl if ok and fl == fl and fl > 0 else math.nan,
            "gbps": work.bytes / (median_ms * 1e6) if ok else math.nan}
