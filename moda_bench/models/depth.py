"""One depth-KV buffer per model and input shape, written in place and read as slices.

`DepthKVBuffer` holds k, v (B, T, E, Hk, d): slot e of every position. A layer writes its
slot once (`write`); a later layer reads the slots it needs as a view (`read`: a slice of the
slot axis, strided where a step is given), which is the (B, T, L, Hk, d) layout that
`moda_attention` and `depth_attention` take for their depth / source K/V. No copy is made
here; whether the kernel copies a strided view is the kernel's business.

Writes go through an alias of the buffer with its own autograd version counter (`.data`), so a
slice saved for a backward by an earlier layer stays valid while later layers write other
slots (the slots a layer read are never written again within a step).

Gradients (`attached`): reads and writes are autograd nodes chained by a zero-size token
(every write takes the previous token, a read the newest), so the backward of a read runs
before that of every write whose slot it read. A read's backward adds its depth gradients
into a gradient buffer of the same layout (or the reader's kernel has added them there itself,
`grad_slices`, and the read gets none); a write's backward hands its slot's sum to the K/V
that was written. Detached (production stacks' default, seed 004): no nodes, no gradient
buffer; the kernels get depth_grad=False.
"""
from __future__ import annotations

import torch


class _Write(torch.autograd.Function):
    @staticmethod
    def forward(ctx, k, v, token, store, index):
        store.k_data[:, :, index].copy_(k)
        store.v_data[:, :, index].copy_(v)
        ctx.store, ctx.index = store, index
        return token.new_zeros(0)

    @staticmethod
    def backward(ctx, _dtoken):
        store, i = ctx.store, ctx.index
        return store.grad_k[:, :, i], store.grad_v[:, :, i], store.token0, None, None


class _Read(torch.autograd.Function):
    @staticmethod
    def forward(ctx, token, store, sl):
        ctx.store, ctx.sl = store, sl
        ctx.set_materialize_grads(False)   # a reader that added its gradients itself passes none
        return store.k[:, :, sl], store.v[:, :, sl]

    @staticmethod
    def backward(ctx, dk, dv):
        store, sl = ctx.store, ctx.sl
        if dk is not None:
            store.grad_k[:, :, sl] += dk
        if dv is not None:
            store.grad_v[:, :, sl] += dv
        return ctx.store.token0, None, None


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
        self.token = None

    def start(self) -> None:
        """Before a forward: a fresh token chain (attached: gradients zeroed)."""
        if self.attached:
            self.grad_k.zero_()
            self.grad_v.zero_()
            self.token = self.token0.detach().requires_grad_(True)

    def write(self, index: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Slot `index` of every position := k, v (B, T, Hk, d)."""
        if self.attached and torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
            self.token = _Write.apply(k, v, self.token, self, index)
        else:
            with torch.no_grad():
                self.k_data[:, :, index].copy_(k)
                self.v_data[:, :, index].copy_(v)

    def read(self, sl: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """Views k[:, :, sl], v[:, :, sl] (B, T, L, Hk, d) of the slots written so far."""
        if self.attached and torch.is_grad_enabled() and self.token is not None:
            return _Read.apply(self.token, self, sl)
        return self.k[:, :, sl], self.v[:, :, sl]

    def reads_attached(self) -> bool:
        """Whether `read` now returns autograd nodes (attached, gradients on, a token chain)."""
        return self.attached and torch.is_grad_enabled() and self.token is not None

    def grad_slices(self, sl: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """The gradient buffer's slots `sl` (views): where a reader that adds its depth gradients
        itself (`moda_attention_into`) puts them, instead of returning them to `read`'s node."""
        return self.grad_k[:, :, sl], self.grad_v[:, :, sl]

    def nbytes(self) -> int:
        """Bytes of the K and V slots (the gradient buffer, when attached, is as large again)."""
        return 2 * self.k.numel() * self.k.element_size()

    def grad_nbytes(self) -> int:
        """Bytes of the gradient buffer's K and V slots (0 when detached)."""
        return self.nbytes() if self.attached else 0
