"""Parameter and model-FLOP counts of a decoder step, and the depth-KV buffer's size.

Model FLOPs (what MFU divides by; no recomputation counted): a training step costs
6 N per trained token (N: the parameters of every matmul, the LM head's included; the embedding
lookup is no matmul), plus 3x the forward's attention FLOPs (causal: 4 Hq d T(T+1)/2 per
sequence and layer, `schema.seq_flops`), plus each variant's own terms, also 3x their forward:
MoDA's depth part (4 Hq d T L_l per layer, `schema.depth_flops`, L_l = 2 l), Depth-Attention's
mix (scores and weighted sum over the S_l + 1 entries, 4 (S_l + 1) Hk d per token and layer),
DenseFormer's weighted averages (2 (i + 2) D per token after block i), Block AttnRes's softmax
over R block representations (4 R D per token and sublayer) and mHC's coefficient projection
and stream mixing (2 n D (n^2 + 2n) + 2 n^2 D + 4 n D per token and sublayer). A prefill is the
forward alone (the LM head on the last position only); a generation adds one forward of every
new token over its cache (4 Hq d n per layer for a cache of n positions).

Memory: `depth_kv_bytes` is seed 004's retained depth-KV formula for the slots a variant keeps.
Traffic: `depth_traffic_bytes` is the least depth K/V a training step moves between HBM and the
SMs (what a kernel can at best hide under compute, never avoid).
"""
from __future__ import annotations

from moda_bench import schema
from moda_bench.models.config import (
    ATTENTION_OF,
    MHC_STREAMS,
    RESIDUAL_OF,
    ModelConfig,
    attnres_block_size,
    dattn_buffer_entries,
    dattn_sources,
    moda_buffer_entries,
    moda_depth_entries,
)


def layer_matmul_params(cfg: ModelConfig) -> int:
    """q, k, v, o projections and the SwiGLU FFN of one layer."""
    D = cfg.hidden
    return D * D * 2 + 2 * D * cfg.kv_dim + 3 * D * cfg.intermediate


def extra_params(cfg: ModelConfig, variant: str) -> int:
    """Parameters a variant adds to the vanilla decoder."""
    L, D, n = cfg.layers, cfg.hidden, MHC_STREAMS
    if variant == "moda":   # the FFN's K/V projection of every layer whose entries a later layer reads
        return (L - 1) * 2 * D * cfg.kv_dim
    residual = RESIDUAL_OF.get(variant)
    if residual == "denseformer":
        return L * (L + 3) // 2
    if residual == "attnres":
        return (2 * L + 1) * D
    if residual == "mhc":
        return 2 * L * (n * D * (n * n + 2 * n) + n * n + 2 * n + 3)
    return 0


def param_count(cfg: ModelConfig, variant: str = "vanilla") -> int:
    """Every parameter of the decoder as built (`models.decoder.Decoder` for one variant)."""
    D, d = cfg.hidden, cfg.head_dim
    emb = cfg.vocab * D * (1 if cfg.tie_embeddings else 2)
    per_layer = layer_matmul_params(cfg) + 2 * D + 2 * d   # + the two RMSNorms and the q/k norms
    return emb + cfg.layers * per_layer + D + extra_params(cfg, variant)


def matmul_params(cfg: ModelConfig, variant: str = "vanilla") -> int:
    """N of 6 N: the matmul parameters (layers, the LM head, MoDA's FFN K/V projection)."""
    extra = extra_params(cfg, variant) if variant == "moda" else 0
    return cfg.layers * layer_matmul_params(cfg) + cfg.vocab * cfg.hidden + extra


def variant_forward_flops(cfg: ModelConfig, variant: str, B: int, T: int) -> float:
    """Forward FLOPs of the variant's own work over B sequences of T tokens (0 for vanilla)."""
    tokens, D, n = B * T, cfg.hidden, MHC_STREAMS
    total = 0.0
    attention, residual = ATTENTION_OF[variant], RESIDUAL_OF.get(variant)
    for layer in range(cfg.layers):
        if attention == "moda":
            total += schema.depth_flops(B, cfg.heads, T, cfg.head_dim, moda_depth_entries(layer))
        elif attention == "dattn":
            S = len(dattn_sources(layer, cfg.dattn_stride))
            total += 4.0 * (S + 1) * cfg.kv_dim * tokens if S else 0.0
        if residual == "denseformer":
            total += 2.0 * (layer + 2) * D * tokens
    if residual == "attnres":
        size = attnres_block_size(cfg.layers)
        for sub in range(2 * cfg.layers + 1):
            R = 1 + sub // size + (1 if sub % size else 0)
            total += 4.0 * R * D * tokens
    elif residual == "mhc":
        total += 2 * cfg.layers * tokens * (2.0 * n * D * (n * n + 2 * n) + 2.0 * n * n * D + 4.0 * n * D)
    return total


def attention_forward_flops(cfg: ModelConfig, B: int, T: int) -> float:
    return cfg.layers * schema.seq_flops(B, cfg.heads, T, cfg.head_dim)


def train_flops(cfg: ModelConfig, variant: str, B: int, T: int, grad_accum: int = 1) -> float:
    """Model FLOPs of one training step: grad_accum micro-batches of B sequences of T tokens."""
    per_micro = (6.0 * matmul_params(cfg, variant) * B * T + 3.0 * attention_forward_flops(cfg, B, T)
                 + 3.0 * variant_forward_flops(cfg, variant, B, T))
    return grad_accum * per_micro


def prefill_flops(cfg: ModelConfig, variant: str, B: int, T: int) -> float:
    """Model FLOPs of a prefill of B prompts of T tokens (LM head on the last position only)."""
    body = matmul_params(cfg, variant) - cfg.vocab * cfg.hidden
    return (2.0 * body * B * T + 2.0 * cfg.vocab * cfg.hidden * B + attention_forward_flops(cfg, B, T)
            + variant_forward_flops(cfg, variant, B, T))


def generate_flops(cfg: ModelConfig, variant: str, B: int, T: int, new_tokens: int) -> float:
    """Model FLOPs of a generation: the prefill, then new_tokens - 1 decode steps of one token
    each (the prefill's logits give the first new token), each over its cache."""
    total = prefill_flops(cfg, variant, B, T)
    per_token = 2.0 * matmul_params(cfg, variant) * B + variant_forward_flops(cfg, variant, B, 1)
    for i in range(1, new_tokens):
        total += per_token + cfg.layers * 4.0 * B * cfg.heads * cfg.head_dim * (T + i)
    return total


def depth_slots(cfg: ModelConfig, variant: str) -> int:
    """Depth-KV slots a variant keeps per position: MoDA's attention K/V and FFN K/V projection of
    every layer but the last (2 a layer), Depth-Attention's keys and mixed values of the layers a
    later layer reads (`dattn_buffer_entries`); 0 for the others."""
    kind = ATTENTION_OF[variant]
    if kind == "moda":
        return moda_buffer_entries(cfg.layers)
    if kind == "dattn":
        return dattn_buffer_entries(cfg.layers, cfg.dattn_stride)
    return 0


def depth_kv_bytes(cfg: ModelConfig, B: int, T: int, bytes_per_element: int, variant: str = "moda") -> int:
    """Seed 004's retained depth-KV memory: batch x sequence x contributing layers x KV heads x
    head dim x bytes x 2 (K and V), the contributing layers counted as the slots the variant keeps
    (`depth_slots`: MoDA keeps two per earlier layer)."""
    return B * T * depth_slots(cfg, variant) * cfg.kv_heads * cfg.head_dim * bytes_per_element * 2


def depth_entries_read(cfg: ModelConfig, variant: str) -> int:
    """Depth entries (a K and a V row each) the variant's layers read per position, summed over the
    layers: MoDA's layer l reads 2 l (`moda_depth_entries`), Depth-Attention's its source layers
    (`dattn_sources`); 0 for the others."""
    kind = ATTENTION_OF[variant]
    if kind == "moda":
        return sum(moda_depth_entries(layer) for layer in range(cfg.layers))
    if kind == "dattn":
        return sum(len(dattn_sources(layer, cfg.dattn_stride)) for layer in range(cfg.layers))
    return 0


def depth_traffic_bytes(cfg: ModelConfig, variant: str, B: int, T: int, bytes_per_element: int,
                        depth_grad: bool = True) -> int:
    """Least depth K/V bytes a training step moves: each layer reads its entries' K and V in the
    forward and again in the backward, and with depth gradients reads and writes their gradients
    too (a slot's gradient collects from every later layer, so it is read, added to and written).
    The slices each layer writes once are left out (one entry's worth a layer)."""
    passes = 4 if depth_grad else 2
    return depth_entries_read(cfg, variant) * B * T * cfg.kv_heads * cfg.head_dim * bytes_per_element * 2 * passes
