"""Sequence-only decode peers that the benchmark times beside `moda_decode` (L = 0: they ignore
depth), each with a `*_unavailable(device)` reason helper that never raises:

* `sdpa_decode`: torch SDPA restricted to one backend (FLASH_ATTENTION or CUDNN_ATTENTION; MATH
  and EFFICIENT_ATTENTION are accepted too, MATH runs on the CPU). GQA through `enable_gqa`,
  else (a backend that refuses it) the KV heads repeated G times, remembered per backend so
  later calls skip the refused attempt. Tq > 1 needs a bottom-right causal mask (new token i
  sees cache positions <= Tk - Tq + i): `torch.nn.attention.bias.causal_lower_right`, which
  torch runs in the flash kernel (whose causal flag means lower-right), else in the efficient
  kernel, else as a materialised boolean mask; with only CUDNN_ATTENTION enabled it is the
  boolean mask, which cuDNN may refuse (then a RuntimeError says so). Tq = 1 needs no mask.
* `fa4_decode`: FlashAttention-4 (`flash_attn.cute.flash_attn_func(causal=True,
  num_splits=...)`, whose causal mask is bottom-right aligned). On Hopper (sm90) FA4 4.0.0b36
  refuses split-KV: the call then runs with num_splits=1 and the detail string says so.
* `flashinfer_decode` / `prepare_flashinfer_decode`: FlashInfer's
  BatchDecodeWithPagedKVCacheWrapper (Tq = 1) or BatchPrefillWithPagedKVCacheWrapper (Tq > 1,
  causal), planned once in prepare (the timed call is the wrapper's run), over the dense cache
  viewed as pages (or the caller's paged cache and block table).

Every peer takes q (B, Tq, Hq, d) and k_cache, v_cache (B, Tk, Hk, d) (all of Tk is the
sequence), returns (B, Tq, Hq, d), and with `return_detail=True` also a one-line string saying
what ran. torch.nn.attention, flash_attn and flashinfer are imported inside the functions.
"""
from __future__ import annotations

import importlib.util
from typing import Callable, Optional

import torch

from moda_bench.kernels.moda.fa4.merge import fa4_unavailable

SDPA_BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
FLASHINFER_WORKSPACE_BYTES = 128 * 1024 * 1024

_GQA_REFUSED: set = set()  # (backend, device, dtype, Tq > 1) whose enable_gqa call raised
_FA4_SPLIT_REFUSED: dict = {}  # (device, dtype) -> why FA4 refused num_splits > 1


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"


def _cuda_device(device) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)


def _shapes(q, k_cache, v_cache, who: str):
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{who}: {name} must be a rank-4 tensor, got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    B, Tq, Hq, d = q.shape
    Bk, Tk, Hk, dk = k_cache.shape
    if v_cache.shape != k_cache.shape or (Bk, dk) != (B, d) or Hq % Hk or Tq > Tk:
        raise ValueError(f"{who}: need q (B, Tq, Hq, d), k_cache = v_cache (B, Tk, Hk, d) with Hq % Hk == 0 and "
                         f"Tq <= Tk; got q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, "
                         f"v_cache {tuple(v_cache.shape)}")
    return B, Tq, Hq, Hk, d, Tk


# ------------------------------------------------------------------ SDPA
def sdpa_unavailable(device=None, backend_name: str = "FLASH_ATTENTION") -> Optional[str]:
    """Why SDPA's `backend_name` cannot run decode on `device` (default: the current CUDA
    device), or None. MATH runs anywhere; the others need a CUDA GPU (flash and cuDNN: sm80+,
    cuDNN also torch's cuDNN)."""
    if backend_name not in SDPA_BACKENDS:
        return f"unknown SDPA backend {backend_name!r}; one of {', '.join(SDPA_BACKENDS)}"
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: F401
        getattr(SDPBackend, backend_name)
    except (ImportError, AttributeError) as exc:
        return f"this torch ({torch.__version__}) has no SDPA backend {backend_name} ({_first_line(exc)})"
    if backend_name == "MATH":
        return None
    if not torch.cuda.is_available():
        return f"SDPA {backend_name} needs CUDA, which is not available"
    try:
        dev = _cuda_device(device)
        if dev.type != "cuda":
            return f"SDPA {backend_name} needs a CUDA device, got {dev}"
        major, minor = torch.cuda.get_device_capability(dev)
    except Exception as exc:  # a bad device index, a broken driver
        return f"cannot query the CUDA device {device!r} ({_first_line(exc)})"
    if backend_name in ("FLASH_ATTENTION", "CUDNN_ATTENTION") and major < 8:
        return f"SDPA {backend_name} needs an sm80+ GPU, this one is sm{major}{minor}"
    if backend_name == "CUDNN_ATTENTION" and not torch.backends.cudnn.is_available():
        return "SDPA CUDNN_ATTENTION needs torch built with cuDNN"
    return None


def sdpa_decode(q, k_cache, v_cache, backend_name: str, *, scale: float | None = None, return_detail: bool = False):
    """Causal decode attention through SDPA with only `backend_name` enabled (see the module
    docstring for GQA and the bottom-right mask). Returns out (B, Tq, Hq, d) [, detail]."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    B, Tq, Hq, Hk, d, Tk = _shapes(q, k_cache, v_cache, "sdpa_decode")
    reason = sdpa_unavailable(q.device if q.device.type == "cuda" else None, backend_name)
    if reason is None and backend_name != "MATH" and q.device.type != "cuda":
        reason = f"q is on {q.device}; SDPA {backend_name} needs CUDA tensors"
    if reason is not None:
        raise RuntimeError(f"sdpa_decode unavailable: {reason}")
    G = Hq // Hk
    qh, kh, vh = q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2)
    mask = causal_lower_right(Tq, Tk) if Tq > 1 else None
    masking = "causal_lower_right" if Tq > 1 else "no mask (Tq=1)"
    key = (backend_name, q.device, q.dtype, Tq > 1)
    with sdpa_kernel([getattr(SDPBackend, backend_name)]):
        try:
            if G > 1 and key not in _GQA_REFUSED:
                try:
                    out = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale,
                                                                           enable_gqa=True)
                    detail = f"SDPA {backend_name}, enable_gqa, {masking}"
                    return (out.transpose(1, 2), detail) if return_detail else out.transpose(1, 2)
                except RuntimeError:
                    _GQA_REFUSED.add(key)
            if G > 1:
                kh, vh = kh.repeat_interleave(G, dim=1), vh.repeat_interleave(G, dim=1)
            out = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
        except RuntimeError as exc:
            raise RuntimeError(f"SDPA {backend_name} refused the decode call (q {tuple(q.shape)}, k_cache "
                               f"{tuple(k_cache.shape)}, {masking}): {_first_line(exc)}") from exc
    detail = f"SDPA {backend_name}, " + ("KV heads repeated x%d (enable_gqa refused), " % G if G > 1 else "") + masking
    return (out.transpose(1, 2), detail) if return_detail else out.transpose(1, 2)


# ------------------------------------------------------------------ FlashAttention-4
def fa4_decode_unavailable(device=None) -> Optional[str]:
    """Why FlashAttention-4 cannot run on `device` (not installed / importable, no CUDA, not an
    sm90/sm100 GPU), or None."""
    return fa4_unavailable(device)


def fa4_decode(q, k_cache, v_cache, num_splits: int | None = 1, *, scale: float | None = None,
               return_detail: bool = False):
    """Causal (bottom-right) decode attention through FA4's `flash_attn_func`; num_splits: FA4's
    split-KV factor (None: FA4's own heuristic). Where FA4 refuses split-KV (sm90) the call runs
    with num_splits=1 and the detail says so. Returns out (B, Tq, Hq, d) [, detail]."""
    _shapes(q, k_cache, v_cache, "fa4_decode")
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"fa4_decode: FlashAttention-4 takes fp16/bf16, q has {q.dtype}")
    if q.device.type != "cuda":
        raise ValueError(f"fa4_decode: q is on {q.device}; FlashAttention-4 needs CUDA tensors")
    reason = fa4_decode_unavailable(q.device)
    if reason is not None:
        raise RuntimeError(f"fa4_decode unavailable: {reason}")
    from flash_attn.cute import flash_attn_func

    want = 0 if num_splits is None else int(num_splits)
    key = (q.device, q.dtype)
    ns, note = want, ""
    if want != 1 and key in _FA4_SPLIT_REFUSED:
        ns, note = 1, f"; split-KV refused on this GPU, ran num_splits=1 ({_FA4_SPLIT_REFUSED[key]})"
    try:
        res = flash_attn_func(q, k_cache, v_cache, softmax_scale=scale, causal=True, num_splits=ns)
    except (AssertionError, NotImplementedError, RuntimeError, ValueError) as exc:
        if ns == 1:
            raise
        _FA4_SPLIT_REFUSED[key] = _first_line(exc)
        ns, note = 1, f"; split-KV refused on this GPU, ran num_splits=1 ({_FA4_SPLIT_REFUSED[key]})"
        res = flash_attn_func(q, k_cache, v_cache, softmax_scale=scale, causal=True, num_splits=1)
    out = res[0] if isinstance(res, tuple) else res
    asked = "auto" if num_splits is None else str(num_splits)
    detail = f"flash_attn.cute.flash_attn_func causal, num_splits={asked}" + note
    return (out, detail) if return_detail else out


# ------------------------------------------------------------------ FlashInfer
def flashinfer_unavailable(device=None) -> Optional[str]:
    """Why FlashInfer cannot run on `device` (not installed, no CUDA, not importable), or None."""
    if importlib.util.find_spec("flashinfer") is None:
        return "flashinfer is not installed (pip install flashinfer-python)"
    if not torch.cuda.is_available():
        return "FlashInfer needs CUDA, which is not available"
    try:
        dev = _cuda_device(device)
        if dev.type != "cuda":
            return f"FlashInfer needs a CUDA device, got {dev}"
        import flashinfer  # noqa: F401
    except Exception as exc:
        return f"flashinfer is not importable ({_first_line(exc)})"
    return None


def _page_lists(B: int, Tk: int, lens: list, page_size: int, block_table, device):
    """FlashInfer's (indptr, indices, last_page_len) for sequences of `lens` tokens, pages from
    block_table rows (or, dense, the Tk // page_size pages of each sequence in order)."""
    counts = [-(-n // page_size) for n in lens]
    if block_table is None:
        per_seq = Tk // page_size
        rows = [torch.arange(b * per_seq, b * per_seq + c, dtype=torch.int32) for b, c in enumerate(counts)]
    else:
        bt = block_table.detach().cpu().to(torch.int32)
        rows = [bt[b, :c] for b, c in enumerate(counts)]
    indptr = torch.tensor([0] + list(torch.tensor(counts).cumsum(0).tolist()), dtype=torch.int32)
    last = torch.tensor([n - (c - 1) * page_size for n, c in zip(lens, counts)], dtype=torch.int32)
    return indptr.to(device), torch.cat(rows).to(device), last.to(device)


def prepare_flashinfer_decode(q, k_cache, v_cache, *, cache_seqlens=None, block_table=None,
                              scale: float | None = None) -> tuple[Callable[[], torch.Tensor], str]:
    """Plan FlashInfer for this call's shapes (outside any timed region): returns (run, detail),
    run() -> out (B, Tq, Hq, d). Dense cache: viewed as pages of 16 positions when 16 divides
    Tk, else one page per sequence; paged: k_cache (num_blocks, page_size, Hk, d) with
    block_table (B, max_blocks) and cache_seqlens."""
    reason = flashinfer_unavailable(q.device if q.device.type == "cuda" else None)
    if reason is None and q.device.type != "cuda":
        reason = f"q is on {q.device}; FlashInfer needs CUDA tensors"
    if reason is not None:
        raise RuntimeError(f"flashinfer_decode unavailable: {reason}")
    import flashinfer

    B, Tq, Hq, d = q.shape
    Hk = k_cache.shape[2]
    if block_table is None:
        _shapes(q, k_cache, v_cache, "flashinfer_decode")
        Tk = k_cache.shape[1]
        page_size = 16 if Tk % 16 == 0 else Tk
        k_pages = k_cache.reshape(B * Tk // page_size, page_size, Hk, d)
        v_pages = v_cache.reshape(B * Tk // page_size, page_size, Hk, d)
    else:
        if cache_seqlens is None:
            raise ValueError("flashinfer_decode: a block_table needs cache_seqlens")
        page_size, Tk = k_cache.shape[1], block_table.shape[1] * k_cache.shape[1]
        k_pages, v_pages = k_cache, v_cache
    lens = [Tk] * B if cache_seqlens is None else [int(n) for n in cache_seqlens.cpu()]
    indptr, indices, last = _page_lists(B, Tk, lens, page_size, block_table, q.device)
    workspace = torch.empty(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=q.device)
    common = dict(q_data_type=q.dtype, kv_data_type=k_cache.dtype, sm_scale=scale)
    if Tq == 1:
        tensor_cores = Hq // Hk >= 4
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=tensor_cores)
        wrapper.plan(indptr, indices, last, Hq, Hk, d, page_size, pos_encoding_mode="NONE", **common)
        q3 = q.reshape(B, Hq, d)
        detail = f"flashinfer BatchDecodeWithPagedKVCacheWrapper NHD page_size={page_size} tensor_cores={tensor_cores}"

        def run():
            return wrapper.run(q3, (k_pages, v_pages)).view(B, 1, Hq, d)
    else:
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        qo_indptr = torch.arange(0, (B + 1) * Tq, Tq, dtype=torch.int32, device=q.device)
        wrapper.plan(qo_indptr, indptr, indices, last, Hq, Hk, d, page_size, causal=True, **common)
        q3 = q.reshape(B * Tq, Hq, d)
        detail = f"flashinfer BatchPrefillWithPagedKVCacheWrapper NHD causal page_size={page_size}"

        def run():
            return wrapper.run(q3, (k_pages, v_pages)).view(B, Tq, Hq, d)
    return run, detail


def flashinfer_decode(q, k_cache, v_cache, *, cache_seqlens=None, block_table=None, scale: float | None = None,
                      return_detail: bool = False):
    """One FlashInfer decode call (plans, then runs; time `prepare_flashinfer_decode`'s run
    instead). Returns out (B, Tq, Hq, d) [, detail]."""
    run, detail = prepare_flashinfer_decode(q, k_cache, v_cache, cache_seqlens=cache_seqlens,
                                            block_table=block_table, scale=scale)
    out = run()
    return (out, detail) if return_detail else out
