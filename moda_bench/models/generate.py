"""Generation with a KV cache: a prefill of the prompts, then one decode step per new token.

`KVCache` holds each layer's K and V (B, capacity, Hk, d), preallocated; a Depth-Attention
layer stores its depth-mixed values in the V slot (seed 002: no state beyond a vanilla
decoder's cache). MoDA needs no depth cache across steps: a token's depth entries are the
earlier layers' K/V of that same token, which its own forward writes into the model's depth
buffer (one buffer of the step's shape, reused by every step). Greedy decoding.
"""
from __future__ import annotations

import torch

from moda_bench.models.config import ModelConfig


class KVCache:
    """k[i], v[i] (B, capacity, Hk, d) of layer i; pos: positions filled."""

    def __init__(self, cfg: ModelConfig, B: int, capacity: int, *, dtype, device):
        shape = (B, capacity, cfg.kv_heads, cfg.head_dim)
        self.k = [torch.empty(shape, dtype=dtype, device=device) for _ in range(cfg.layers)]
        self.v = [torch.empty(shape, dtype=dtype, device=device) for _ in range(cfg.layers)]
        self.pos = 0

    def write(self, layer: int, pos: int, k, v) -> None:
        """Positions pos .. pos + T of layer's cache := k, v (B, T, Hk, d)."""
        T = k.shape[1]
        self.k[layer][:, pos:pos + T].copy_(k)
        self.v[layer][:, pos:pos + T].copy_(v)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


@torch.no_grad()
def prefill(model, prompt, variant: str, cache: KVCache | None = None):
    """The last position's logits (B, 1, vocab) of the prompts (B, T); fills `cache` if given."""
    return model(prompt, variant, cache=cache, last_only=True)


@torch.no_grad()
def generate(model, prompt, variant: str, new_tokens: int) -> torch.Tensor:
    """new_tokens greedy tokens (B, new_tokens) after the prompts (B, T)."""
    B, T = prompt.shape
    w = model.embed.weight
    cache = KVCache(model.cfg, B, T + new_tokens, dtype=w.dtype, device=w.device)
    tok = prefill(model, prompt, variant, cache)[:, -1].argmax(-1, keepdim=True)
    out = [tok]
    for _ in range(new_tokens - 1):
        tok = model(tok, variant, cache=cache, last_only=True)[:, -1].argmax(-1, keepdim=True)
        out.append(tok)
    return torch.cat(out, dim=1)
