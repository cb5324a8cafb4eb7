"""How the descriptor kernels (`kernel_fwd_tma`, `kernel_bwd_tma`) reach their tiles: TMA tensor
descriptors built on the device (`tl.make_tensor_descriptor`, with the global scratch Triton asks
an allocator for) or on the host (`triton.tools.tensor_descriptor.TensorDescriptor`, passed as a
kernel argument), the tile loads through either or through masked pointers, and TMA's alignment
rule (`aligned`).

Host-side descriptors are the default where Triton has them (`host_descriptors`). A device-side
descriptor costs every program its build: the tensor map written to global memory, a proxy fence
and a barrier, one after another for each descriptor; at short T those prologues hold a large
share of the passes' warp samples (docs/DESIGN.md, "The Triton kernel"). A host-side
descriptor is encoded once a launch by Triton's launcher and reaches every program as a kernel parameter.
`set_host_descriptors(False)` (or MODA_BENCH_HOST_DESC=0 in the environment) keeps the device-side
builds (A/B timing). Each builder below has its host twin (`*_hdesc`) describing the same view with
the same box; a kernel whose HOST_DESC constexpr is set takes the twin in its tensor's argument
slot; `ops.launch.TensorMaps` keeps their encoded tensor maps between launches.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

try:  # Triton >= 3.4
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - an older Triton
    TensorDescriptor = None


@triton.jit
def rows_desc(X, B, T, Hq, P: tl.constexpr, GP: tl.constexpr, D: tl.constexpr):
    """Descriptor of a (B,T,Hq,D) tensor (q, o, do) in boxes of P positions x GP heads: one folded row block."""
    return tl.make_tensor_descriptor(X, shape=[B, T, Hq, D], strides=[T.to(tl.int64) * Hq * D, Hq * D, D, 1],
                                     block_shape=[1, P, GP, D])


@triton.jit
def keys_desc(X, B, T, Hk, BN: tl.constexpr, D: tl.constexpr):
    """Descriptor of a (B,T,Hk,D) tensor (k, v) as (B*T, Hk*D) rows in boxes of BN keys of one head."""
    return tl.make_tensor_descriptor(X, shape=[B * T, Hk * D], strides=[Hk * D, 1], block_shape=[BN, D])


@triton.jit
def depth_rows_desc(X, B, T, LD, Hk, P: tl.constexpr, BL: tl.constexpr, D: tl.constexpr):
    """Descriptor of a (B,T,LD,Hk,D) depth tensor as (B*T, LD, Hk*D) in boxes of P positions x BL
    depth entries of one head (the forward's depth phase)."""
    return tl.make_tensor_descriptor(X, shape=[B * T, LD, Hk * D], strides=[LD * Hk * D, Hk * D, 1],
                                     block_shape=[P, BL, D])


@triton.jit
def depth_desc(X, B, T, LD, Hk, P: tl.constexpr, BL: tl.constexpr, D: tl.constexpr):
    """Descriptor of a (B,T,LD,Hk,D) depth tensor as (B, T, LD, Hk*D) in boxes of P positions x BL
    depth entries of one head (the dq pass's depth part: loads, and stores of the depth gradients)."""
    return tl.make_tensor_descriptor(X, shape=[B, T, LD, Hk * D], strides=[T.to(tl.int64) * LD * Hk * D,
                                     LD * Hk * D, Hk * D, 1], block_shape=[1, P, BL, D])


@triton.jit
def depth_descs(X, Y, B, T, LD, Hk, P: tl.constexpr, BL: tl.constexpr, D: tl.constexpr):
    """`depth_desc`s of two depth tensors of one shape: the depth keys and values, or their
    gradients (the backward's depth parts: dq pass, depth items, depth kernel)."""
    return depth_desc(X, B, T, LD, Hk, P, BL, D), depth_desc(Y, B, T, LD, Hk, P, BL, D)


@triton.jit
def depth_descs_at(X, Y, B, T, LD, Hk, sb, st, sl, P: tl.constexpr, BL: tl.constexpr, D: tl.constexpr):
    """`depth_descs` of two (B,T,LD,Hk,D) views sharing the element strides (sb, st, sl, D, 1): e.g.
    slices along the slot axis of one model-wide (B, T, slots, Hk, D) buffer, described in place.
    The lists are written in each call: a list bound to a name becomes a tuple of tensors, and a
    descriptor's last stride must stay the constant 1 (compiled, not interpreted, code rejects it)."""
    return (tl.make_tensor_descriptor(X, shape=[B, T, LD, Hk * D], strides=[sb.to(tl.int64), st, sl, 1],
                                      block_shape=[1, P, BL, D]),
            tl.make_tensor_descriptor(Y, shape=[B, T, LD, Hk * D], strides=[sb.to(tl.int64), st, sl, 1],
                                      block_shape=[1, P, BL, D]))


@triton.jit
def rows_ptr(b, j, g0, r, T, G, Hq, GP: tl.constexpr, D: tl.constexpr):
    """Offsets [BM, D] of folded rows r (GP heads a position from head g0 of KV head j's group)
    into a (B,T,Hq,D) tensor and their mask (t < T, g < G)."""
    t = r // GP
    g = g0 + r % GP
    ptr = ((b * T + t).to(tl.int64) * Hq + j * G + g)[:, None] * D + tl.arange(0, D)[None, :]
    return ptr, ((t < T) & (g < G))[:, None]


@triton.jit
def rows_tile(X, xdesc, b, j, g0, t0, T, G, Hq, GP: tl.constexpr, BM: tl.constexpr, D: tl.constexpr,
              USE_DESC: tl.constexpr):
    """[BM, D] tile of q or do from position t0 of (b, KV head j), GP heads a position from head
    g0 of its group (0: all of them, the padded group). Padding rows hold the next head's values
    (descriptor) or zeros (pointers): their lse2 = +inf makes them contribute 0."""
    if USE_DESC:
        return tl.reshape(xdesc.load([b, t0, j * G + g0, 0]), (BM, D))
    else:
        ptr, ok = rows_ptr(b, j, g0, t0 * GP + tl.arange(0, BM), T, G, Hq, GP, D)
        return tl.load(X + ptr, mask=ok, other=0.0)


@triton.jit
def keys_tile(X, xdesc, b, j, n0, T, Hk, BN: tl.constexpr, D: tl.constexpr, USE_DESC: tl.constexpr):
    """[BN, D] tile of k or v from key n0 (keys past T: the next sequence's or zeros, always masked)."""
    if USE_DESC:
        return xdesc.load([b * T + n0, j * D])
    else:
        kn = n0 + tl.arange(0, BN)
        ptr = ((b * T + kn).to(tl.int64) * Hk + j)[:, None] * D + tl.arange(0, D)[None, :]
        return tl.load(X + ptr, mask=(kn < T)[:, None], other=0.0)


# ----------------------------------------------------------------------------- host side

# set_host_descriptors; MODA_BENCH_HOST_DESC=0 in the environment starts a process with them off
_HOST = [TensorDescriptor is not None
         and os.environ.get("MODA_BENCH_HOST_DESC", "1") not in ("0", "false", "off")]


def host_descriptors() -> bool:
    """Whether the descriptor kernels' launches pass host-side descriptors (else built per program)."""
    return _HOST[0]


def set_host_descriptors(on: bool) -> bool:
    """Host-side descriptors on or off for this process (where Triton has them); returns the old state."""
    old = _HOST[0]
    _HOST[0] = bool(on) and TensorDescriptor is not None
    return old


def _desc(t, shape: list, strides: list, block: list):
    """A TensorDescriptor without its constructor's checks (their host cost adds up: a fwd+bwd
    passes about 18 descriptors): the builders below pass `aligned` tensors, contiguous views
    and boxes the kernels compiled with; the padding (and any later field) keeps its class default."""
    d = _NEW(TensorDescriptor)
    d.base, d.shape, d.strides, d.block_shape = t, shape, strides, block
    return d


_NEW = object.__new__


def rows_hdesc(x, P: int, GP: int):
    """`rows_desc` on the host: (B,T,Hq,D) in [1, P, GP, D] boxes."""
    B, T, H, D = x.shape
    return _desc(x, [B, T, H, D], [T * H * D, H * D, D, 1], [1, P, GP, D])


def keys_hdesc(x, BN: int):
    """`keys_desc` on the host: (B,T,Hk,D) as (B*T, Hk*D) in [BN, D] boxes."""
    B, T, Hk, D = x.shape
    return _desc(x, [B * T, Hk * D], [Hk * D, 1], [BN, D])


def depth_rows_hdesc(x, B: int, T: int, LD: int, Hk: int, D: int, P: int, BL: int):
    """`depth_rows_desc` on the host: x (B,T,LD,Hk,D), or k (B,T,Hk,D) standing in at L = 0 (LD = 1)."""
    return _desc(x, [B * T, LD, Hk * D], [LD * Hk * D, Hk * D, 1], [P, BL, D])


def depth_hdesc(x, B: int, T: int, LD: int, Hk: int, D: int, P: int, BL: int, strides=None):
    """`depth_desc` on the host (x as in `depth_rows_hdesc`); strides: x's (batch, position, slot)
    element strides where it is a strided view (`depth_descs_at`), else None (contiguous)."""
    sb, st, sl = strides or (T * LD * Hk * D, LD * Hk * D, Hk * D)
    return _desc(x, [B, T, LD, Hk * D], [sb, st, sl, 1], [1, P, BL, D])


def descriptors_available() -> bool:
    """Whether this Triton builds device-side tensor descriptors (3.4 and later)."""
    return hasattr(tl, "make_tensor_descriptor")


_ALLOCATION: list = []  # Triton's allocation module, looked up once (None: another Triton layout)


def _null_allocator():
    """(the allocator Triton has for this context, Triton's null allocator)."""
    if not _ALLOCATION:
        try:
            from triton.runtime import _allocation
            _ALLOCATION.append(_allocation if hasattr(_allocation, "_allocator") else None)
        except ImportError:  # pragma: no cover - another Triton layout
            _ALLOCATION.append(None)
    mod = _ALLOCATION[0]
    if mod is None:  # pragma: no cover
        return None, None
    return mod._allocator.get(), getattr(mod, "_NULL_ALLOCATOR", None)


_SCRATCH_DEVICE: list = []  # torch.device("cuda") (the current one at each call), or "cpu" without CUDA


def _torch_alloc(size: int, alignment: int, stream):
    """Global scratch for device-side descriptors (128 bytes a program), from torch's caching
    allocator on the current device: cheap, and capture-safe under CUDA graphs. Triton asks for it
    at every launch of a descriptor kernel, so CUDA's availability is asked once."""
    if not _SCRATCH_DEVICE:
        _SCRATCH_DEVICE.append(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    return torch.empty(size, dtype=torch.int8, device=_SCRATCH_DEVICE[0])


def ensure_allocator() -> None:
    """Device-side descriptors need Triton's global scratch allocator. Install ours only where
    none is set (a user's own allocator is kept); Triton keeps it per thread context, so this is
    asked at every launch (a context-variable read)."""
    current, null = _null_allocator()
    if current is None or current is null:
        triton.set_allocator(_torch_alloc)


def aligned(*tensors, contiguous: bool = False) -> bool:
    """TMA's rule: base addresses and every stride but the last 16-byte multiples. A contiguous
    tensor's strides are read as the kernels address it, from its shape (each a multiple of the
    last dimension's length: one product instead of a loop over strides, which torch leaves
    arbitrary on dimensions of length 1). contiguous: every tensor must also be contiguous."""
    for t in tensors:
        if t is None:
            continue
        if t.data_ptr() % 16:
            return False
        if t.is_contiguous():
            if t.dim() > 1 and (t.shape[-1] * t.element_size()) % 16:
                return False
        elif contiguous or any((s * t.element_size()) % 16 for s in t.stride()[:-1]):
            return False
    return True
