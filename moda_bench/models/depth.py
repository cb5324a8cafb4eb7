"""One depth-KV buffer per model and input shape, written in place and read as slices.

`DepthKVBuffer` holds k, v (B, T, E, Hk, d): slot e of every position. A layer writes its
slot once (`write`); a later layer reads the slots it needs as a view (`read`: a slice of the
slot axis, strided where a step is given), which is the (B, T, L, Hk, d) layout that
`moda_attention` and `depth_attention` take for their depth / source K/V. No copy is made
here; whether the kernel copies a strided view is the kernel's business.

Writes go through an alias of the buffer with its own autograd version counter (`.data`), so a
slice saved for a backward by an earlier layer stays valid while later layers write other
slots (the slots a layer read are never written again within a step).

Order and gradients go through a token (a tiny tensor) that the caller threads through the
step: `start` gives the first, every `write` takes the newest and returns the next, a `read`
takes the newest. Attached, reads and writes are autograd nodes of that chain, so the backward
of a read runs before that of every write whose slot it read. A read's backward adds its depth
gradients into a gradient buffer of the same layout; a write's backward hands its slot's sum to
the K/V that was written. Detached (production stacks' default, seed 004): no gradient buffer,
the kernels get depth_grad=False.

Two paths run the same slot functions (`oplib.through_ops`): eager, the autograd Functions
`_Write` / `_Read`; under torch.compile (or `set_eager_ops(True)`), the torch custom ops
`moda_bench::depth_start`, `depth_write`, `depth_read` and their backward ops. The ops take the
buffer by its integer handle, never as a tensor argument: the buffer is invisible to the graph,
so functionalisation neither copies it per write nor sees the write/read aliasing, and the
tokens are the graph's only record of the order (every op consumes and returns one, so no
reordering or dead-code pass can move a write past a read of its slot). A slot's gradient is
returned as a view of the gradient buffer (each slot's gradient is consumed once, by its write's
backward; a reader that adds its depth gradients there itself, `grad_slices`, hands the read
none). Under torch.compile, `read(..., copy=True)` gives plain-torch consumers a copy:
inductor may write a kernel's output into the memory of an input at its last use, and the
buffer's memory must stay the buffer's.
"""
from __future__ import annotations

import itertools
import weakref
from typing import Optional

import torch
from torch import Tensor

from moda_bench.kernels.oplib import through_ops

_STORES: "weakref.WeakValueDictionary[int, DepthKVBuffer]" = weakref.WeakValueDictionary()
_HANDLES = itertools.count(1)


def _store(handle: int) -> "DepthKVBuffer":
    store = _STORES.get(handle)
    if store is None:
        raise RuntimeError(f"depth-KV buffer {handle} no longer exists (a compiled step outlived its model's buffers: "
                           f"call Decoder.prepare again and recompile)")
    return store


def slot_range(sl: slice, entries: int) -> tuple[int, int, int]:
    """(start, stop, step) of `sl` over `entries` slots, as `sl.indices(entries)` gives them for a
    positive step (the only kind a tensor slice takes), in plain int arithmetic: dynamo traces this
    where some torch releases do not trace the builtin `slice.indices` (a graph break per read)."""
    step = 1 if sl.step is None else sl.step
    if step <= 0:
        raise ValueError(f"depth slots are read with a positive step, got {sl}")
    return _slot_bound(sl.start, 0, entries), _slot_bound(sl.stop, entries, entries), step


def _slot_bound(i: Optional[int], default: int, entries: int) -> int:
    """A slice bound over `entries` slots: None -> default, negative -> from the end, clamped."""
    if i is None:
        return default
    return min(max(i + entries if i < 0 else i, 0), entries)


# ------------------------------------------------------------------ what both paths run
def _write_slot(store, index: int, k, v) -> None:
    store.k_data[:, :, index].copy_(k)
    store.v_data[:, :, index].copy_(v)


def _add_grads(store, sl: slice, dk, dv) -> None:
    if dk is not None:
        store.grad_k[:, :, sl] += dk
    if dv is not None:
        store.grad_v[:, :, sl] += dv


def _slot_grads(store, index: int):
    return store.grad_k[:, :, index], store.grad_v[:, :, index]


class _Write(torch.autograd.Function):
    @staticmethod
    def forward(ctx, k, v, token, store, index):
        _write_slot(store, index, k, v)
        ctx.store, ctx.index = store, index
        return token.new_zeros(0)

    @staticmethod
    def backward(ctx, _dtoken):
        return *_slot_grads(ctx.store, ctx.index), ctx.store.token0, None, None


class _Read(torch.autograd.Function):
    @staticmethod
    def forward(ctx, token, store, sl):
        ctx.store, ctx.sl = store, sl
        ctx.set_materialize_grads(False)   # a reader that added its gradients itself passes none
        return store.k[:, :, sl], store.v[:, :, sl]

    @staticmethod
    def backward(ctx, dk, dv):
        _add_grads(ctx.store, ctx.sl, dk, dv)
        return ctx.store.token0, None, None


# ------------------------------------------------------------------ the custom ops
def _fake_slots(buf: Tensor, device, sl) -> Tensor:
    """A fake buf[:, :, sl] (sl: a slice or a slot index): the same sizes, strides and storage
    offset, built from buf's layout alone (a fake implementation may not run ops on the real buffer)."""
    return torch.empty_strided(buf.shape, buf.stride(), dtype=buf.dtype, device=device)[:, :, sl]


@torch.library.custom_op("moda_bench::depth_start", mutates_args=())
def depth_start_op(like: Tensor, handle: int) -> Tensor:
    """The first token of a step on like's device (attached buffers: gradients zeroed)."""
    _store(handle).zero_grads()
    return like.new_zeros(1, dtype=torch.float32)


@depth_start_op.register_fake
def _(like, handle):
    return like.new_empty(1, dtype=torch.float32)


@torch.library.custom_op("moda_bench::depth_write", mutates_args=())
def depth_write_op(k: Tensor, v: Tensor, token: Tensor, handle: int, index: int) -> Tensor:
    """Slot `index` of every position := k, v (B, T, Hk, d); returns the next token."""
    _write_slot(_store(handle), index, k, v)
    return token.new_zeros(1)


@depth_write_op.register_fake
def _(k, v, token, handle, index):
    return token.new_empty(1)


@torch.library.custom_op("moda_bench::depth_write_bwd", mutates_args=())
def depth_write_bwd_op(dtoken: Tensor, handle: int, index: int) -> tuple[Tensor, Tensor, Tensor]:
    """(dk, dv, dtoken): the gradients summed into slot `index` by the reads' backward."""
    gk, gv = _slot_grads(_store(handle), index)
    return gk, gv, dtoken.new_zeros(1)


@depth_write_bwd_op.register_fake
def _(dtoken, handle, index):
    store = _store(handle)
    return (_fake_slots(store.grad_k, dtoken.device, index), _fake_slots(store.grad_v, dtoken.device, index),
            dtoken.new_empty(1))


@torch.library.custom_op("moda_bench::depth_read", mutates_args=())
def depth_read_op(token: Tensor, handle: int, start: int, stop: int, step: int) -> tuple[Tensor, Tensor]:
    """Views k[:, :, start:stop:step], v[...] (B, T, L, Hk, d) of the buffer (not copies)."""
    store = _store(handle)
    sl = slice(start, stop, step)
    return store.k[:, :, sl], store.v[:, :, sl]


@depth_read_op.register_fake
def _(token, handle, start, stop, step):
    store = _store(handle)
    sl = slice(start, stop, step)
    return _fake_slots(store.k, token.device, sl), _fake_slots(store.v, token.device, sl)


@torch.library.custom_op("moda_bench::depth_read_bwd", mutates_args=())
def depth_read_bwd_op(dk: Optional[Tensor], dv: Optional[Tensor], token: Tensor, handle: int, start: int, stop: int,
                      step: int) -> Tensor:
    """Adds dk, dv into the gradient buffer's slots start:stop:step; returns the token's gradient."""
    _add_grads(_store(handle), slice(start, stop, step), dk, dv)
    return token.new_zeros(1)


@depth_read_bwd_op.register_fake
def _(dk, dv, token, handle, start, stop, step):
    return token.new_empty(1)


def _write_setup(ctx, inputs, output):
    ctx.call = inputs[3:]


def _write_backward(ctx, dtoken):
    dk, dv, dtok = depth_write_bwd_op(dtoken, *ctx.call)
    return dk, dv, dtok, None, None


def _read_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.call = inputs[1:]
    ctx.set_materialize_grads(False)


def _read_backward(ctx, dk, dv):
    (token,) = ctx.saved_tensors
    return depth_read_bwd_op(dk, dv, token, *ctx.call), None, None, None, None


depth_write_op.register_autograd(_write_backward, setup_context=_write_setup)
depth_read_op.register_autograd(_read_backward, setup_context=_read_setup)


class DepthKVBuffer:
    """k, v (B, T, entries, Hk, d) of one forward; attached: gradients flow to what was written."""

    def __init__(self, B: int, T: int, entries: int, Hk: int, d: int, *, dtype, device, attached: bool):
        shape = (B, T, entries, Hk, d)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.k_data, self.v_data = self.k.data, self.v.data   # writes: not seen by saved views' version checks
        self.attached = attached
        self.entries = entries
        self.token0 = torch.zeros(0, dtype=dtype, device=device)
        if attached:
            self.grad_k = torch.zeros(shape, dtype=dtype, device=device)
            self.grad_v = torch.zeros(shape, dtype=dtype, device=device)
        self.handle = next(_HANDLES)
        _STORES[self.handle] = self

    def zero_grads(self) -> None:
        if self.attached:
            self.grad_k.zero_()
            self.grad_v.zero_()

    def start(self, like: Tensor) -> Tensor:
        """Before a forward: the step's first token (attached: gradients zeroed); like: any
        tensor on the buffer's device."""
        if through_ops():
            return depth_start_op(like.detach(), self.handle)
        self.zero_grads()
        return self.token0

    def write(self, token: Tensor, index: int, k: Tensor, v: Tensor) -> Tensor:
        """Slot `index` of every position := k, v (B, T, Hk, d); returns the next token."""
        if through_ops():
            if not self.attached:
                k, v = k.detach(), v.detach()
            return depth_write_op(k, v, token, self.handle, index)
        if self.attached and torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
            return _Write.apply(k, v, token, self, index)
        with torch.no_grad():
            _write_slot(self, index, k, v)
        return token

    def read(self, token: Tensor, sl: slice, *, copy: bool = False) -> tuple[Tensor, Tensor]:
        """Views k[:, :, sl], v[:, :, sl] (B, T, L, Hk, d) of the slots written so far (token:
        the newest). copy: the caller's consumers are plain torch ops, which get a copy under
        torch.compile (module docstring)."""
        if through_ops():
            kd, vd = depth_read_op(token, self.handle, *slot_range(sl, self.entries))
            if copy and torch.compiler.is_compiling():
                kd, vd = kd.clone(), vd.clone()
            return kd, vd
        if self.attached and torch.is_grad_enabled() and token.requires_grad:
            return _Read.apply(token, self, sl)
        return self.k[:, :, sl], self.v[:, :, sl]

    def reads_attached(self, token: Tensor) -> bool:
        """Whether an eager `read` with this token returns autograd nodes (attached, gradients on)."""
        return self.attached and torch.is_grad_enabled() and token.requires_grad

    def grad_slices(self, sl: slice) -> tuple[Tensor, Tensor]:
        """The gradient buffer's slots `sl` (views): where a reader that adds its depth gradients
        itself (`moda_attention_into`) puts them, instead of returning them to `read`'s node."""
        return self.grad_k[:, :, sl], self.grad_v[:, :, sl]

    def grad_nbytes(self) -> int:
        """Bytes of the gradient buffer's K and V slots (0 when detached)."""
        return self.nbytes() if self.attached else 0

    def nbytes(self) -> int:
        """Bytes of the K and V slots (the gradient buffer, when attached, is as large again)."""
        return 2 * self.k.numel() * self.k.element_size()
