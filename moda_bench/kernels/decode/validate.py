"""Input checking for the MoDA decode operator, its sizes (`DecodeShape`) and the bytes one call
must move (`decode_bytes`).

Layouts (FlashAttention's `flash_attn_with_kvcache` conventions):
* q (B, Tq, Hq, d): the Tq newest tokens of each sequence;
* k_cache, v_cache (B, Tk, Hk, d) dense, or (num_blocks, page_size, Hk, d) pages with a
  block_table (B, max_blocks) int32 (logical position t of sequence b lives in page
  block_table[b, t // page_size], slot t % page_size; capacity Tk = max_blocks * page_size);
* k_depth, v_depth (B, Tq, L, Hk, d) or both None (L = 0);
* cache_seqlens (B,) int32 or None (every sequence holds Tk tokens); required with a block_table.

Values (cache_seqlens in [Tq, Tk], the used block-table entries in [0, num_blocks)) can only be
checked by reading them; `check_decode_inputs(check_values=...)` says when that happens, so a
caller on the GPU can avoid a device sync per call.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from moda_bench.kernels.checks import check_cuda, check_depth_pair, check_dtypes_devices, shape_str
from moda_bench.kernels.moda.validate import MAX_DEPTH, SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS

MAX_SPLITS = 256


@dataclass(frozen=True)
class DecodeShape:
    """The sizes of one decode call. Tk is the cache capacity in logical positions (dense: the
    cache's second axis; paged: max_blocks * page_size); page_size is 0 for a dense cache."""

    B: int
    Tq: int
    Hq: int
    Hk: int
    d: int
    L: int
    Tk: int
    page_size: int = 0
    num_blocks: int = 0

    @property
    def G(self) -> int:
        return self.Hq // self.Hk

    @property
    def paged(self) -> bool:
        return self.page_size > 0


def decode_bytes(shape: DecodeShape, itemsize: int, cache_tokens: int | None = None) -> int:
    """Bytes one decode call must move at the least: the sequence cache read once (K and V of
    `cache_tokens` positions, default B * Tk, i.e. sum_b n_b with ragged lengths), the depth
    entries (K and V, B*Tq*L), q read and out written:

        itemsize * (2*cache_tokens*Hk*d + 2*B*Tq*L*Hk*d + 2*B*Tq*Hq*d)

    (block table and cache_seqlens, a few bytes per sequence, are left out)."""
    n = shape.B * shape.Tk if cache_tokens is None else int(cache_tokens)
    s = shape
    return itemsize * (2 * n * s.Hk * s.d + 2 * s.B * s.Tq * s.L * s.Hk * s.d + 2 * s.B * s.Tq * s.Hq * s.d)


def _check_types(named: dict, seqlens, block_table) -> None:
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("cache_seqlens", seqlens), ("block_table", block_table)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor (int32) or None, got {type(t).__name__}")


def _check_ranks(named: dict, paged: bool) -> None:
    layouts = {"q": "(B, Tq, Hq, d)", "k_depth": "(B, Tq, L, Hk, d)", "v_depth": "(B, Tq, L, Hk, d)"}
    cache = "(num_blocks, page_size, Hk, d)" if paged else "(B, Tk, Hk, d)"
    for name, t in named.items():
        want = 5 if name.endswith("_depth") else 4
        if t.dim() != want:
            raise ValueError(f"{name} must have rank {want} with layout {layouts.get(name, cache)}, "
                             f"got shape {shape_str(t)}")


def _check_index_tensor(name: str, t: torch.Tensor, want: tuple, layout: str, q: torch.Tensor) -> None:
    if t.dim() != len(want) or tuple(t.shape) != want:
        raise ValueError(f"{name} must have shape {layout} = {want}, got {shape_str(t)}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must have dtype torch.int32, got {t.dtype}")
    if t.device != q.device:
        raise ValueError(f"{name} is on {t.device} but q is on {q.device}")


def _check_values(shape: DecodeShape, seqlens, block_table) -> None:
    """cache_seqlens in [Tq, Tk]; the block-table entries a sequence uses in [0, num_blocks)."""
    if seqlens is not None:
        n = seqlens.detach().cpu().long()
        bad = ((n < shape.Tq) | (n > shape.Tk)).nonzero()
        if bad.numel():
            b = int(bad[0, 0])
            why = (f"fewer than the Tq={shape.Tq} new tokens (Tq > n_b)" if int(n[b]) < shape.Tq
                   else f"more than the cache holds (Tk={shape.Tk})")
            raise ValueError(f"cache_seqlens[{b}] = {int(n[b])}: a sequence must hold between Tq={shape.Tq} and "
                             f"Tk={shape.Tk} tokens; {why}")
    if block_table is not None:
        n = seqlens.detach().cpu().long()
        bt = block_table.detach().cpu().long()
        for b in range(shape.B):
            used = bt[b, : -(-int(n[b]) // shape.page_size)]
            bad = ((used < 0) | (used >= shape.num_blocks)).nonzero()
            if bad.numel():
                p = int(bad[0, 0])
                raise ValueError(f"block_table[{b}, {p}] = {int(used[p])} is not a page of k_cache "
                                 f"(num_blocks={shape.num_blocks}); sequence {b} uses its first "
                                 f"{used.numel()} entries")


def check_decode_inputs(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_depth: torch.Tensor | None,
    v_depth: torch.Tensor | None,
    cache_seqlens: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    *,
    need_cuda: bool = False,
    dtypes: tuple = SUPPORTED_DTYPES,
    head_dims: tuple | None = SUPPORTED_HEAD_DIMS,
    check_values: bool | None = None,
) -> DecodeShape:
    """Validate a decode call and return its sizes.

    TypeError for non-tensors and wrong dtypes, ValueError for bad shapes and values, each
    message naming the tensor, its shape and what was expected. check_values: read
    cache_seqlens and block_table to check their values (True), never (False), or only where
    that costs no device sync, i.e. when they are CPU tensors (None).
    """
    named = {"q": q, "k_cache": k_cache, "v_cache": v_cache}
    if (k_depth is None) != (v_depth is None):
        raise ValueError("k_depth and v_depth must both be given or both be None "
                         f"(got k_depth={'None' if k_depth is None else 'tensor'}, "
                         f"v_depth={'None' if v_depth is None else 'tensor'})")
    if k_depth is not None:
        named["k_depth"], named["v_depth"] = k_depth, v_depth
    _check_types(named, cache_seqlens, block_table)
    paged = block_table is not None
    _check_ranks(named, paged)
    check_dtypes_devices(named, q, dtypes)
    B, Tq, Hq, d = q.shape
    if B < 1 or Tq < 1 or Hq < 1:
        raise ValueError(f"q must have B, Tq, Hq >= 1, got {shape_str(q)}")
    if head_dims is not None and d not in head_dims:
        raise ValueError(f"head dim d={d} (last axis of q {shape_str(q)}) is not supported; use one of {head_dims}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"v_cache must have the shape of k_cache {shape_str(k_cache)}, got {shape_str(v_cache)}")
    n0, n1, Hk, dk = k_cache.shape
    if paged:
        if dk != d or n0 < 1 or n1 < 1:
            raise ValueError(f"k_cache must have shape (num_blocks, page_size, Hk, d={d}) with a block_table, "
                             f"got {shape_str(k_cache)}")
        if block_table.dim() != 2 or block_table.shape[0] != B or block_table.shape[1] < 1:
            raise ValueError(f"block_table must have shape (B={B}, max_blocks), got {shape_str(block_table)}")
        _check_index_tensor("block_table", block_table, (B, block_table.shape[1]), "(B, max_blocks)", q)
        if cache_seqlens is None:
            raise ValueError("cache_seqlens (B,) int32 is required with a block_table: a paged cache has no "
                             "implicit length")
        num_blocks, page_size, Tk = n0, n1, block_table.shape[1] * n1
    else:
        if (n0, dk) != (B, d) or n1 < 1:
            raise ValueError(f"k_cache must have shape (B={B}, Tk, Hk, d={d}) to match q {shape_str(q)}, "
                             f"got {shape_str(k_cache)}")
        num_blocks, page_size, Tk = 0, 0, n1
    if Hk < 1 or Hq % Hk != 0:
        raise ValueError(f"q heads Hq={Hq} must be a multiple of the cache's KV heads Hk={Hk} "
                         f"(q {shape_str(q)}, k_cache {shape_str(k_cache)})")
    if Tq > Tk:
        raise ValueError(f"q has Tq={Tq} new tokens but the cache holds at most Tk={Tk} positions "
                         f"(q {shape_str(q)}, k_cache {shape_str(k_cache)})")
    L = check_depth_pair(k_depth, v_depth, {"B": B, "Tq": Tq}, Hk, d, MAX_DEPTH)
    if cache_seqlens is not None:
        _check_index_tensor("cache_seqlens", cache_seqlens, (B,), "(B,)", q)
    check_cuda(q, need_cuda)
    shape = DecodeShape(B=B, Tq=Tq, Hq=Hq, Hk=Hk, d=d, L=L, Tk=Tk, page_size=page_size, num_blocks=num_blocks)
    if check_values is None:
        check_values = all(t is None or t.device.type == "cpu" for t in (cache_seqlens, block_table))
    if check_values:
        _check_values(shape, cache_seqlens, block_table)
    return shape
