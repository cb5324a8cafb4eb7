"""The decode pass's providers and inputs: one inference step of the Tq newest tokens of
B sequences over a KV cache of T tokens each, plus each new token's L depth entries.

Inputs (`make_decode_inputs`, fresh random, never zeros): q (B, Tq, Hq, d), k_cache and v_cache
(B, T, Hk, d), k_depth and v_depth (B, Tq, L, Hk, d) (None for sequence-only peers, which run the
point with L = 0). A point whose inputs would not fit in the GPU's free memory is skipped with
the reason (the providers of a point are staged together, so each one's inputs count against
what the ones before it left free). The accuracy check compares batch 0's whole output with the
float64 decode reference.

Providers (op "decode"; `bench.providers` registers `PROVIDERS`):
- moda: `moda_decode`, split-KV with the automatic number of splits;
- moda-nosplit: the same kernel with one split (what split-KV buys at small B);
- fa2, cudnn: SDPA's flash and cuDNN backends; fa4: FlashAttention-4 with its number of splits
  chosen per point; flashinfer: FlashInfer's decode (optional, skipped with the reason when
  it is not installed). These are sequence-only (L = 0), as in the training passes.
"""
from __future__ import annotations

from typing import Callable, Optional

from moda_bench import floor
from moda_bench.bench.provider_types import DECODE, Prepared, Provider, ProviderSkip, needs_triton_op

FREE_MEMORY_SHARE = 0.85   # a point's inputs may take at most this share of the GPU's free memory


def decode_input_bytes(point, L: int) -> int:
    """Bytes of a decode point's inputs and output (what must fit on the GPU): the bytes the
    floor model counts for the call (each read or written once)."""
    return int(floor.decode_work(point.B, point.T, max(point.Tq, 1), point.Hq, point.Hk, point.d, L,
                                 dtype=point.dtype).bytes)


def point_does_not_fit(point, providers, device: str) -> Optional[str]:
    """The reason a decode point is skipped as a whole, or None: the providers of a point are staged
    together, each with its own inputs, so together they must fit in the GPU's free memory."""
    if not str(device).startswith("cuda") or not providers:
        return None
    import torch
    need = sum(decode_input_bytes(point, p.depth_entries(point)) for p in providers)
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    if need > FREE_MEMORY_SHARE * free:
        return (f"does not fit: the {len(providers)} providers' inputs need {need / 2**30:.1f} GiB together, "
                f"{free / 2**30:.1f} GiB free on the GPU")
    return None


def make_decode_inputs(point, L: int, *, device: str, seed: int, dtype) -> dict:
    """Fresh random decode inputs for `point` with L depth entries (0: none). ProviderSkip when
    they would not fit in the GPU's free memory; ValueError when Tq > T."""
    import torch
    Tq = max(point.Tq, 1)
    if Tq > point.T:
        raise ProviderSkip(f"Tq={Tq} new tokens do not fit a cache of T={point.T}")
    need = decode_input_bytes(point, L)
    if str(device).startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        if need > FREE_MEMORY_SHARE * free:
            raise ProviderSkip(f"does not fit: inputs need {need / 2**30:.1f} GiB, "
                               f"{free / 2**30:.1f} GiB free on the GPU")
    g = torch.Generator(device=device)
    g.manual_seed(seed)

    def rnd(*shape):   # drawn in the inputs' dtype: no float32 copy twice the cache's size
        return torch.randn(*shape, generator=g, device=device, dtype=dtype)

    B, T, Hq, Hk, d = point.B, point.T, point.Hq, point.Hk, point.d
    return {"q": rnd(B, Tq, Hq, d), "k": rnd(B, T, Hk, d), "v": rnd(B, T, Hk, d),
            "k_depth": rnd(B, Tq, L, Hk, d) if L else None, "v_depth": rnd(B, Tq, L, Hk, d) if L else None,
            "do": None}


def check_decode_accuracy(forward: Callable, inputs: dict) -> float:
    """||out - ref|| / ||ref|| of batch 0 against the float64 decode reference."""
    import torch

    from moda_bench.kernels.decode import decode_reference
    from moda_bench.timing import max_rel_err
    with torch.no_grad():
        out = forward()
        one = {k: (t[:1] if t is not None else None) for k, t in inputs.items() if k != "do"}
        ref = decode_reference(one["q"], one["k"], one["v"], one["k_depth"], one["v_depth"],
                               out_dtype=torch.float64)
    return max_rel_err(out[:1], ref)


# ---------------------------------------------------------------------------------------------
# providers
# ---------------------------------------------------------------------------------------------

_needs_decode_kernel = needs_triton_op("moda_bench.kernels.decode", "the decode kernel")


def auto_splits(point, device) -> int:
    """The split-KV factor `moda_decode(num_splits=None)` chooses at `point` on `device` (the
    device's default tile's block_n, its SM count)."""
    from moda_bench.kernels.decode import choose_num_splits, default_config
    from moda_bench.kernels.decode.interface import sm_count
    block_n = default_config(device, point.B * point.Hk).resolved(point.d).block_n
    return choose_num_splits(point.B, point.Hk, point.T, sm_count(device), block_n)


def _moda(num_splits: Optional[int]):
    def prepare(inputs, point, chunk):
        from moda_bench.kernels.decode import default_config, moda_decode
        q = inputs["q"]
        splits = auto_splits(point, q.device) if num_splits is None else num_splits
        tiles = default_config(q.device, point.B * point.Hk).resolved(point.d)
        args = (q, inputs["k"], inputs["v"], inputs["k_depth"], inputs["v_depth"])
        return Prepared(lambda: moda_decode(*args, num_splits=splits),
                        impl_detail=f"moda_decode split-KV, {splits} split(s)"
                        + (" (chosen per point)" if num_splits is None else " (pinned)")
                        + f", {tiles.block_n}-key tiles, {tiles.num_warps} warps, {tiles.num_stages} stages",
                        config={"num_splits": splits, "block_n": tiles.block_n, "num_warps": tiles.num_warps,
                                "num_stages": tiles.num_stages})
    return prepare


def _sdpa(backend: str, label: str):
    def prepare(inputs, point, chunk):
        from moda_bench.kernels.decode import peers
        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        _, detail = peers.sdpa_decode(q, k, v, backend, return_detail=True)   # settles the GQA route once
        return Prepared(lambda: peers.sdpa_decode(q, k, v, backend),
                        impl_detail=f"{label}; {detail}; sequence-only (no depth)")
    return prepare


def _sdpa_unavailable(backend: str) -> Callable[[str], Optional[str]]:
    def check(device: str) -> Optional[str]:
        from moda_bench.kernels.decode import peers
        return peers.sdpa_unavailable(device, backend)
    return check


def _fa4(inputs, point, chunk):
    from moda_bench.kernels.decode import peers
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    want = auto_splits(point, q.device)
    _, detail = peers.fa4_decode(q, k, v, want, return_detail=True)   # a refused split is remembered
    return Prepared(lambda: peers.fa4_decode(q, k, v, want), impl_detail=f"{detail}; sequence-only (no depth)",
                    config={"num_splits_asked": want})


def _fa4_unavailable(device: str) -> Optional[str]:
    from moda_bench.kernels.decode import peers
    return peers.fa4_decode_unavailable(device)


def _flashinfer(inputs, point, chunk):
    from moda_bench.kernels.decode import peers
    run, detail = peers.prepare_flashinfer_decode(inputs["q"], inputs["k"], inputs["v"])
    return Prepared(run, impl_detail=f"{detail}; sequence-only (no depth)")


def _flashinfer_unavailable(device: str) -> Optional[str]:
    from moda_bench.kernels.decode import peers
    return peers.flashinfer_unavailable(device)


PROVIDERS = [
    Provider("moda", _moda(None), unavailable=_needs_decode_kernel, op=DECODE,
             description="MoDA decode kernel (Triton, split-KV, depth tail in the combine)"),
    Provider("moda-nosplit", _moda(1), unavailable=_needs_decode_kernel, op=DECODE,
             description="MoDA decode kernel with one split (no split-KV)"),
    Provider("fa2", _sdpa("FLASH_ATTENTION", "SDPA FLASH_ATTENTION backend"), uses_depth=False,
             unavailable=_sdpa_unavailable("FLASH_ATTENTION"), op=DECODE,
             description="SDPA flash backend, no depth"),
    Provider("cudnn", _sdpa("CUDNN_ATTENTION", "SDPA CUDNN_ATTENTION backend"), uses_depth=False,
             unavailable=_sdpa_unavailable("CUDNN_ATTENTION"), op=DECODE,
             description="SDPA cuDNN backend, no depth"),
    Provider("fa4", _fa4, uses_depth=False, unavailable=_fa4_unavailable, op=DECODE,
             description="FlashAttention-4 with its number of splits chosen per point, no depth"),
    Provider("flashinfer", _flashinfer, uses_depth=False, unavailable=_flashinfer_unavailable, op=DECODE,
             description="FlashInfer decode (optional extra), no depth"),
]

DEFAULT_DECODE_PROVIDERS = ["moda", "moda-nosplit", "fa2", "cudnn", "fa4", "flashinfer"]

__all__ = ["PROVIDERS", "DEFAULT_DECODE_PROVIDERS", "make_decode_inputs", "check_decode_accuracy",
           "decode_input_bytes", "point_does_not_fit"]
