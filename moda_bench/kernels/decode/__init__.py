"""MoDA decode: one inference step over a sequence KV cache plus each new token's depth entries.

q (B, Tq, Hq, d) holds the Tq newest tokens of each sequence (Tq = 1: plain decode; Tq > 1:
speculative / MTP verification, chunked prefill); their keys and values are already in the
cache k_cache, v_cache (B, Tk, Hk, d) (or pages (num_blocks, page_size, Hk, d) with a
block_table), sequence b holding cache_seqlens[b] = n_b tokens. New token i (position
n_b - Tq + i), query head h, attends to cache positions 0 .. n_b - Tq + i of KV head h // G and to
its own L depth entries k_depth, v_depth (B, Tq, L, Hk, d), under one softmax.

This package's face:
- `moda_decode`: the Triton flash-decoding kernel (split-KV + log-sum-exp combine, the depth
  tail merged in the same combine), `DecodeConfig` (its tiles), `choose_num_splits`;
- `decode_reference`: the float64 dense oracle;
- `DecodeShape`, `check_decode_inputs`, `decode_bytes` (the bytes a call must move);
- the sequence-only peers the benchmark times: `sdpa_decode`, `fa4_decode`,
  `flashinfer_decode` / `prepare_flashinfer_decode`, with their `*_unavailable` reasons.
"""
from moda_bench.kernels.decode.interface import DecodeConfig, choose_num_splits, default_config, moda_decode
from moda_bench.kernels.decode.peers import (
    fa4_decode,
    fa4_decode_unavailable,
    flashinfer_decode,
    flashinfer_unavailable,
    prepare_flashinfer_decode,
    sdpa_decode,
    sdpa_unavailable,
)
from moda_bench.kernels.decode.reference import decode_reference
from moda_bench.kernels.decode.validate import DecodeShape, check_decode_inputs, decode_bytes

__all__ = ["moda_decode", "DecodeConfig", "choose_num_splits", "default_config", "decode_reference", "DecodeShape",
           "check_decode_inputs", "decode_bytes", "sdpa_decode", "sdpa_unavailable", "fa4_decode",
           "fa4_decode_unavailable", "flashinfer_decode", "prepare_flashinfer_decode", "flashinfer_unavailable"]
