"""Seed 002's cross-layer baselines: how blocks are connected instead of the plain residual.

Each is written as its paper publishes it, in plain PyTorch (as seed 002 timed them):
- `DenseFormer` (Pagliardini et al. 2024, the 1x1 setting): after block i a depth-weighted
  average (DWA) of the embedding and every block output so far, sum_j alpha_ij X_j, is the next
  block's input; the weights start as the identity (alpha_ii = 1).
- `BlockAttnRes` (Attention Residuals, Block AttnRes): every sublayer (attention and FFN count
  one each) reads a softmax-weighted sum of the stored block representations (the embedding,
  each finished block's summed sublayer outputs) and the running sum of the current block,
  weights softmax_r(w_s . rms(V_r)) with a learned pseudo-query w_s per sublayer (zero at start:
  a plain average); a block spans 2L / 8 sublayers, so 8 blocks (seed 002, Table 7). The final
  norm reads one more such aggregation.
- `MHC` (manifold-constrained hyper-connections, n = 4 streams): the residual is n streams
  x (B, T, n, D); per sublayer, from rms(flattened x) a linear map gives the pre weights
  (sigmoid), post weights (2 sigmoid) and an n x n mixing matrix projected onto doubly
  stochastic matrices by 20 Sinkhorn-Knopp iterations; the sublayer reads sum_i pre_i x_i and
  x := H_res x + post^T y. The streams start as copies of the embedding and are summed at the end.
"""
from __future__ import annotations

import torch
from torch import nn

from moda_bench.models.config import MHC_SINKHORN_ITERS, MHC_STREAMS, attnres_block_size
from moda_bench.models.layers import RMS_EPS, rms


class DenseFormer(nn.Module):
    """DWA weights of every block: alphas[i] has i + 2 entries (embedding, blocks 0..i)."""

    def __init__(self, layers: int, dtype=None, device=None):
        super().__init__()
        self.alphas = nn.ParameterList()
        for i in range(layers):
            a = torch.zeros(i + 2, dtype=dtype, device=device)
            a[-1] = 1.0
            self.alphas.append(nn.Parameter(a))

    def mix(self, i: int, outputs: list) -> torch.Tensor:
        """The input of block i + 1: DWA over outputs = [embedding, block 0, ..., block i]."""
        stacked = torch.stack(outputs, dim=0)
        return torch.tensordot(self.alphas[i], stacked, dims=1)


class BlockAttnRes(nn.Module):
    """Pseudo-queries of the 2L sublayers and the final aggregation.

    The published weights softmax_r(w_s . rms(V_r)) over the stored sources V_r (the embedding and
    every finished block) and the current block's running sum. The stored sources are kept stacked,
    (B, T, n, D) with their 1 / rms (B, T, n), grown by one `torch.cat` when a block finishes
    (`after`); a sublayer then takes its logits with one matrix-vector product over the stack,
    (V_r . w_s) / rms_r, and its input with one batched product, whatever n is: the per-source form
    dispatched three ops a source and a sublayer, which on the H100 left the GPU idle for about a
    quarter of the step (1.5B, 24 layers: the step's device time 185 ms of 234). The running sum's
    logit is w_s . rms(partial) (`layers.rms`, one fused op)."""

    def __init__(self, layers: int, dim: int, dtype=None, device=None, eps: float = RMS_EPS):
        super().__init__()
        self.block = attnres_block_size(layers)
        self.eps = eps
        self.queries = nn.Parameter(torch.zeros(2 * layers + 1, dim, dtype=dtype, device=device))

    def inv_rms(self, v: torch.Tensor) -> torch.Tensor:
        """1 / sqrt(mean(v^2) + eps) over the last dimension, float32 (B, T)."""
        sq = torch.linalg.vector_norm(v, dim=-1, dtype=torch.float32).square() / v.shape[-1]
        return torch.rsqrt(sq + self.eps)

    def start(self, h: torch.Tensor) -> tuple:
        """The stored sources before the first sublayer: the embedding (B, T, 1, D) and its 1 / rms (B, T, 1)."""
        return h.unsqueeze(-2), self.inv_rms(h).unsqueeze(-1)

    def aggregate(self, sub: int, blocks: tuple, partial) -> torch.Tensor:
        """Sublayer `sub`'s input from the stored sources (`start`'s pair, stacked) and the current
        block's running sum (None right after a block finishes)."""
        values, inv = blocks
        w = self.queries[sub]
        logits = torch.matmul(values, w).float() * inv                    # (B, T, n)
        if partial is not None:
            own = torch.matmul(rms(partial, self.eps), w).float()         # (B, T)
            logits = torch.cat([logits, own.unsqueeze(-1)], dim=-1)
        weights = torch.softmax(logits, dim=-1).to(w.dtype)
        n = values.shape[-2]
        out = torch.matmul(weights[..., :n].unsqueeze(-2), values).squeeze(-2)
        return out if partial is None else torch.addcmul(out, partial, weights[..., n:])

    def after(self, sub: int, blocks: tuple, partial, out):
        """(blocks, partial) once sublayer `sub` has produced `out`."""
        partial = out if partial is None else partial + out
        if (sub + 1) % self.block == 0:
            values, inv = blocks
            return (torch.cat([values, partial.unsqueeze(-2)], dim=-2),
                    torch.cat([inv, self.inv_rms(partial).unsqueeze(-1)], dim=-1)), None
        return blocks, partial


def sinkhorn(logits: torch.Tensor, iters: int = MHC_SINKHORN_ITERS) -> torch.Tensor:
    """exp(logits) (..., n, n) alternately row- and column-normalised `iters` times."""
    m = torch.exp(logits - logits.amax(dim=(-2, -1), keepdim=True))
    for _ in range(iters):
        m = m / m.sum(-1, keepdim=True)
        m = m / m.sum(-2, keepdim=True)
    return m


class MHC(nn.Module):
    """Per-sublayer coefficient maps of n-stream manifold-constrained hyper-connections."""

    def __init__(self, layers: int, dim: int, n: int = MHC_STREAMS, dtype=None, device=None):
        super().__init__()
        self.n = n
        out = n * n + 2 * n
        self.maps = nn.ModuleList(nn.Linear(n * dim, out, bias=True, dtype=dtype, device=device)
                                  for _ in range(2 * layers))
        self.scales = nn.Parameter(torch.full((2 * layers, 3), 0.01, dtype=dtype, device=device))
        for m in self.maps:
            nn.init.normal_(m.weight, std=0.01)
            nn.init.zeros_(m.bias)

    def expand(self, h: torch.Tensor) -> torch.Tensor:
        """n copies of the embedding: (B, T, n, D)."""
        return h.unsqueeze(-2).expand(*h.shape[:-1], self.n, h.shape[-1]).contiguous()

    def coefficients(self, sub: int, x: torch.Tensor):
        """(pre (B,T,n), post (B,T,n), res (B,T,n,n)) of sublayer `sub` from the streams x."""
        n = self.n
        c = self.maps[sub](rms(x.flatten(-2)))
        a_pre, a_post, a_res = self.scales[sub]
        pre = torch.sigmoid(a_pre * c[..., :n])
        post = 2 * torch.sigmoid(a_post * c[..., n:2 * n])
        res = sinkhorn((a_res * c[..., 2 * n:]).float().unflatten(-1, (n, n))).to(x.dtype)
        return pre, post, res

    def sublayer(self, sub: int, x: torch.Tensor, f) -> torch.Tensor:
        """x after sublayer `sub` (f: (B, T, D) -> (B, T, D)) with its hyper-connections."""
        pre, post, res = self.coefficients(sub, x)
        y = f((pre.unsqueeze(-1) * x).sum(-2))
        return torch.matmul(res, x) + post.unsqueeze(-1) * y.unsqueeze(-2)

    def collapse(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(-2)
