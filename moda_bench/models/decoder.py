"""The decoder stack of `moda-bench model`: one set of weights, run as any of its variants.

`Decoder(cfg, variants)` holds the vanilla decoder's parameters (embedding, per layer RMSNorms,
q/k/v/o projections with Qwen3's q/k norms and RoPE, SwiGLU FFN, final norm, LM head) plus
each requested variant's own parameters (MoDA's FFN K/V projection, DenseFormer's DWA weights,
Block AttnRes's pseudo-queries, mHC's coefficient maps). `forward(tokens, variant)` runs it as
one variant, so several variants share the weights and one optimizer while they are timed
side by side (each step touches only its own parameters' gradients).

Attention per variant (`config.ATTENTION_OF`):
- vanilla: `layers.sequence_attention` (FA4 where it runs, else SDPA);
- moda: MoDA attention over the layer's sequence K/V and its depth slice of the model's one
  `DepthKVBuffer` (slot 2i: layer i's attention K/V, slot 2i + 1: its FFN's K/V projection of
  the FFN input, rotated like a key of the same position). Eager, by the implementation the
  dispatcher chooses for the layer's shape (`moda_route`: `dispatch.choose` with the model's
  `moda_impl`; decided on a shape's first call and kept). "auto", the default, takes only the
  routes that read the buffer's strided slice in place, today the Triton kernel: the FA4 routes
  copy each layer's slice to contiguous and keep the copy for the backward (memory growing with
  layers squared); a pinned `moda_impl` runs them anyway (an A/B). Attached depth
  through `routed.moda_route_into` (the depth gradients added into the buffer's gradient slots:
  by the Triton backward kernel where it takes the pointer passes, else after the route's
  backward), detached depth through the route with depth_grad=False. Compiled, `moda_attention`'s
  custom op (the Triton kernel) whatever moda_impl says;
- depth-attention (-torch): `depth_attention` with the fused (plain-PyTorch) mix over the
  stride's source layers, whose keys and mixed values sit in a buffer slot per layer.
With a `generate.KVCache` a call is a prefill (cache empty) or a decode step: MoDA through
`moda_decode` with this step's depth buffer, Depth-Attention storing its mixed values in the
V cache, the others through `layers.decode_attention`.

Under torch.compile every variant's `loss` traces as one graph: the depth buffer (model state,
not a graph input) is allocated by `prepare` before the compiled call, Depth-Attention's chained
backend is resolved here at construction, and the buffer's reads and writes are custom ops
ordered by the token `Step` carries (depth.py).

Time is labelled with torch.profiler ranges (`LABELS`) for `bench.model`'s breakdown.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

from moda_bench.models.config import (
    ATTENTION_OF,
    RESIDUAL_OF,
    ModelConfig,
    check_variant,
    dattn_sources,
    moda_depth_entries,
)
from moda_bench.models.depth import DepthKVBuffer
from moda_bench.models.flops import depth_slots
from moda_bench.models.layers import (
    RMSNorm,
    SwiGLU,
    apply_rope,
    decode_attention,
    label,
    rope_tables,
    sequence_attention,
)
from moda_bench.models.residual import MHC, BlockAttnRes, DenseFormer

LABELS = ("attention", "depth-kv", "ffn-kv", "projections", "ffn", "residual-mix", "lm-head")


@dataclass
class Step:
    """What one forward call needs besides the weights."""

    variant: str
    cos: torch.Tensor
    sin: torch.Tensor
    depth: Optional[DepthKVBuffer]
    depth_grad: bool
    cache: object = None
    pos: int = 0
    seqlens: Optional[torch.Tensor] = None
    token: Optional[torch.Tensor] = None   # the depth buffer's newest token (depth.py)

    @property
    def decoding(self) -> bool:
        return self.cache is not None and self.pos > 0


class Layer(nn.Module):
    def __init__(self, cfg: ModelConfig, ffn_kv: bool, dtype, device):
        super().__init__()
        D, kv, d = cfg.hidden, cfg.kv_dim, cfg.head_dim
        kw = {"bias": False, "dtype": dtype, "device": device}
        self.attn_norm = RMSNorm(D, cfg.rms_eps, dtype, device)
        self.ffn_norm = RMSNorm(D, cfg.rms_eps, dtype, device)
        self.q_proj, self.k_proj = nn.Linear(D, D, **kw), nn.Linear(D, kv, **kw)
        self.v_proj, self.o_proj = nn.Linear(D, kv, **kw), nn.Linear(D, D, **kw)
        self.q_norm, self.k_norm = RMSNorm(d, cfg.rms_eps, dtype, device), RMSNorm(d, cfg.rms_eps, dtype, device)
        self.ffn = SwiGLU(D, cfg.intermediate, dtype, device)
        self.ffn_kv = nn.Linear(D, 2 * kv, **kw) if ffn_kv else None


# why the model's "auto" runs the Triton kernel for a layer with depth slots (moda_route)
IN_PLACE_REASON = ("the model's auto: the only route that reads the strided depth slice in place (the FA4 routes "
                   "copy it per layer and keep the copy for the backward)")


class Decoder(nn.Module):
    # MoDA with attached depth, eager: `moda_attention_into` adds each layer's depth gradients into
    # the depth buffer's gradient slots; in its backward kernel (True), after it (False), or by
    # `accumulate.in_kernel_default` (None: in the kernel, every backward placement)
    depth_grad_in_kernel = None
    # MoDA, eager: copy each layer's depth slice to a contiguous tensor before its kernel (an A/B
    # of reading the buffer in place, the default)
    depth_copy = False

    def __init__(self, cfg: ModelConfig, variants=("vanilla",), *, dtype=torch.float32, device="cpu",
                 init_std: float = 0.01, moda_impl: str = "auto"):
        super().__init__()
        from moda_bench.kernels.moda.dispatch import check_impl_name
        check_impl_name(moda_impl, "moda_impl")
        self.cfg, self.variants = cfg, tuple(check_variant(v) for v in variants)
        self.moda_impl = moda_impl
        self._routes: dict = {}   # (B, T, L, depth_grad, training) -> dispatch.Choice (`moda_route`)
        D = cfg.hidden
        self.embed = nn.Embedding(cfg.vocab, D, dtype=dtype, device=device)
        moda = "moda" in self.variants
        self.layers = nn.ModuleList(Layer(cfg, moda and i < cfg.layers - 1, dtype, device) for i in range(cfg.layers))
        self.norm = RMSNorm(D, cfg.rms_eps, dtype, device)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(D, cfg.vocab, bias=False, dtype=dtype, device=device)
        kinds = {RESIDUAL_OF.get(v) for v in self.variants}
        self.dense = DenseFormer(cfg.layers, dtype, device) if "denseformer" in kinds else None
        self.attnres = BlockAttnRes(cfg.layers, D, dtype, device) if "attnres" in kinds else None
        self.mhc = MHC(cfg.layers, D, dtype=dtype, device=device) if "mhc" in kinds else None
        for name, p in self.named_parameters():
            if p.dim() == 2 and "mhc" not in name:
                nn.init.normal_(p, std=init_std)
        self.seq_attn, self.seq_attn_name = sequence_attention(torch.device(device), dtype)
        # Depth-Attention's chained sequence backend (FA4's where it runs, else None: composed),
        # resolved here so that no compiled step looks up packages or devices
        from moda_bench.kernels.dattn import chain_backend
        self.dattn_chain = chain_backend(torch.device(device), dtype) if any(
            ATTENTION_OF[v] == "dattn" for v in self.variants) else None
        self._buffers_by_shape: dict = {}

    # ------------------------------------------------------------------ depth buffers
    def depth_entries(self, variant: str) -> int:
        """Slots of the variant's depth buffer (`flops.depth_slots`, the count the memory formula uses)."""
        return depth_slots(self.cfg, variant)

    def depth_buffer(self, variant: str, B: int, T: int, attached: bool) -> Optional[DepthKVBuffer]:
        """The model's depth-KV buffer for this variant and shape (allocated once, then reused)."""
        entries = self.depth_entries(variant)
        if entries == 0:
            return None
        key = (ATTENTION_OF[variant], B, T, attached)
        buf = self._buffers_by_shape.get(key)
        if buf is None:
            if torch.compiler.is_compiling():
                raise RuntimeError(f"no depth buffer for {variant} at B={B}, T={T}: call Decoder.prepare before a "
                                   f"compiled call")
            w = self.embed.weight
            buf = DepthKVBuffer(B, T, entries, self.cfg.kv_heads, self.cfg.head_dim, dtype=w.dtype, device=w.device,
                                attached=attached)
            self._buffers_by_shape[key] = buf
        return buf

    def depth_buffer_bytes(self) -> tuple[int, int]:
        """(K/V bytes, gradient-buffer bytes) of the depth-KV buffers this model holds now."""
        held = self.depth_buffers()
        return sum(b.nbytes() for b in held), sum(b.grad_nbytes() for b in held)

    def depth_buffers(self) -> list:
        """The depth buffers allocated so far."""
        return list(self._buffers_by_shape.values())

    def drop_buffers(self) -> None:
        self._buffers_by_shape.clear()

    def prepare(self, variant: str, B: int, T: int, *, depth_grad: bool = True,
                grad: bool = True) -> Optional[DepthKVBuffer]:
        """The depth buffer a call of `variant` on (B, T) tokens uses (T: the model's input
        length; `loss` takes T + 1 tokens), with autograd enabled (grad) or not, allocated if
        need be (None: the variant has none). A compiled call needs it done first: the buffer is
        the model's state, not the graph's."""
        attached = grad and (bool(depth_grad) or ATTENTION_OF[check_variant(variant)] == "dattn")
        return self.depth_buffer(variant, B, T, attached)

    # ------------------------------------------------------------------ MoDA routes
    def moda_route(self, B: int, T: int, L: int, *, depth_grad: bool, training: bool):
        """The `dispatch.Choice` a MoDA layer with L depth slots runs on (B, T) tokens, eager:
        `dispatch.choose` for its shape with this model's moda_impl, made on the shape's first
        call and kept (never inside a compiled trace: compiled steps take the custom op). Without
        training depth_grad means nothing and counts as True (a prefill passes none)."""
        depth_grad = bool(depth_grad) or not training
        key = (B, T, L, depth_grad, bool(training))
        hit = self._routes.get(key)
        if hit is None:
            from moda_bench.kernels.moda import dispatch
            from moda_bench.kernels.moda.validate import MoDAShape
            if self.moda_impl == "auto" and L > 0:
                hit = dispatch.Choice("triton", IN_PLACE_REASON)
            else:
                cfg, w = self.cfg, self.embed.weight
                shape = MoDAShape(B=B, T=T, Hq=cfg.heads, Hk=cfg.kv_heads, d=cfg.head_dim, L=L)
                hit = dispatch.choose(shape, w.dtype, w.device, depth_grad=depth_grad, training=training,
                                      impl=self.moda_impl)
            self._routes[key] = hit
        return hit

    def moda_routes(self, B: int, T: int, *, depth_grad: bool, training: bool) -> list:
        """[(L, Choice)] of every layer in order (`moda_route`), as an eager MoDA step runs them."""
        Ls = [moda_depth_entries(i) for i in range(self.cfg.layers)]
        return [(L, self.moda_route(B, T, L, depth_grad=depth_grad, training=training)) for L in Ls]

    # ------------------------------------------------------------------ sublayers
    def attention(self, i: int, x, st: Step):
        layer, cfg = self.layers[i], self.cfg
        B, T, D = x.shape
        with label("projections"):
            q = layer.q_norm(layer.q_proj(x).view(B, T, cfg.heads, cfg.head_dim))
            k = layer.k_norm(layer.k_proj(x).view(B, T, cfg.kv_heads, cfg.head_dim))
            v = layer.v_proj(x).view(B, T, cfg.kv_heads, cfg.head_dim)
            q, k = apply_rope(q, st.cos, st.sin), apply_rope(k, st.cos, st.sin)
        kind = ATTENTION_OF[st.variant]
        if kind == "moda":
            o = self._moda(i, q, k, v, st)
        elif kind == "dattn":
            o = self._dattn(i, q, k, v, st)
        else:
            o = self._plain(q, k, v, st, i)
        with label("projections"):
            return layer.o_proj(o.reshape(B, T, D))

    def _cache_write(self, st: Step, i: int, k, v) -> None:
        if st.cache is not None:
            st.cache.write(i, st.pos, k, v)

    def _plain(self, q, k, v, st: Step, i: int):
        self._cache_write(st, i, k, v)
        with label("attention"):
            if st.decoding:
                return decode_attention(q, st.cache.k[i], st.cache.v[i], st.pos + q.shape[1])
            return self.seq_attn(q, k, v)

    def _moda(self, i: int, q, k, v, st: Step):
        from moda_bench.kernels.decode import moda_decode
        from moda_bench.kernels.moda import dispatch, moda_attention
        from moda_bench.kernels.moda.routed import moda_route_into
        n = moda_depth_entries(i)
        kd = vd = None
        if n:
            with label("depth-kv"):
                kd, vd = st.depth.read(st.token, slice(0, n))
                if self.depth_copy and not torch.compiler.is_compiling():
                    kd, vd = kd.contiguous(), vd.contiguous()
        self._cache_write(st, i, k, v)
        with label("attention"):
            if st.decoding:
                o = moda_decode(q, st.cache.k[i], st.cache.v[i], kd, vd, cache_seqlens=st.seqlens)
            elif torch.compiler.is_compiling():   # the custom op (the Triton kernel)
                o = moda_attention(q, k, v, kd, vd, depth_grad=st.depth_grad)
            else:
                B, T = q.shape[:2]
                route = self.moda_route(B, T, n, depth_grad=st.depth_grad, training=torch.is_grad_enabled())
                if n and st.depth.reads_attached(st.token):
                    o = moda_route_into(route, q, k, v, kd, vd, *st.depth.grad_slices(slice(0, n)),
                                        in_kernel=self.depth_grad_in_kernel)
                elif route.impl == "triton":
                    o = moda_attention(q, k, v, kd, vd, depth_grad=st.depth_grad, impl="triton")
                else:
                    o = dispatch.run(route, q, k, v, kd, vd, scale=None, return_lse=False, depth_grad=st.depth_grad)
        if st.depth is not None and 2 * i < st.depth.entries:
            with label("depth-kv"):
                st.token = st.depth.write(st.token, 2 * i, k, v)
        return o

    def _dattn(self, i: int, q, k, v, st: Step):
        from moda_bench.kernels.dattn import depth_attention, depth_mix, depth_mix_torch
        stride, fused = self.cfg.dattn_stride, st.variant == "depth-attention"
        src = dattn_sources(i, stride)
        ks = vs = None
        if src:
            with label("depth-kv"):
                ks, vs = st.depth.read(st.token, slice(src[0], i, stride), copy=not fused)
        with label("attention"):
            if st.decoding:
                v_mixed = (depth_mix if fused else depth_mix_torch)(q, k, v, ks, vs) if src else v
                self._cache_write(st, i, k, v_mixed)
                o = decode_attention(q, st.cache.k[i], st.cache.v[i], st.pos + q.shape[1])
            elif src:
                chained = fused and self.dattn_chain is not None
                o, v_mixed = depth_attention(q, k, v, ks, vs, mix="triton" if fused else "torch", return_mixed=True,
                                             attention=self.dattn_chain if chained else self.seq_attn)
                self._cache_write(st, i, k, v_mixed)
            else:
                o, v_mixed = self.seq_attn(q, k, v), v
                self._cache_write(st, i, k, v)
        if i + stride < self.cfg.layers:
            with label("depth-kv"):
                st.token = st.depth.write(st.token, i, k, v_mixed)
        return o

    def ffn(self, i: int, x, st: Step):
        layer, cfg = self.layers[i], self.cfg
        if ATTENTION_OF[st.variant] == "moda" and layer.ffn_kv is not None:
            B, T, _ = x.shape
            with label("ffn-kv"):
                kf, vf = layer.ffn_kv(x).view(B, T, 2, cfg.kv_heads, cfg.head_dim).unbind(2)   # backward: one stack
                kf = apply_rope(kf, st.cos, st.sin)
            with label("depth-kv"):
                st.token = st.depth.write(st.token, 2 * i + 1, kf, vf)
        with label("ffn"):
            return layer.ffn(x)

    # ------------------------------------------------------------------ the stack
    def body(self, h, st: Step):
        L, residual = self.cfg.layers, RESIDUAL_OF.get(st.variant)
        attn = lambda i, u: self.attention(i, self.layers[i].attn_norm(u), st)  # noqa: E731
        ffn = lambda i, u: self.ffn(i, self.layers[i].ffn_norm(u), st)          # noqa: E731
        if residual is None:
            for i in range(L):
                h = h + attn(i, h)
                h = h + ffn(i, h)
            return h
        if residual == "denseformer":
            outputs = [h]
            for i in range(L):
                y = h + attn(i, h)
                outputs.append(y + ffn(i, y))
                with label("residual-mix"):
                    h = self.dense.mix(i, outputs)
            return h
        if residual == "attnres":
            with label("residual-mix"):
                blocks, partial = self.attnres.start(h), None
            for sub in range(2 * L):
                with label("residual-mix"):
                    u = self.attnres.aggregate(sub, blocks, partial)
                out = (attn if sub % 2 == 0 else ffn)(sub // 2, u)
                with label("residual-mix"):
                    blocks, partial = self.attnres.after(sub, blocks, partial, out)
            with label("residual-mix"):
                return self.attnres.aggregate(2 * L, blocks, partial)
        x = self.mhc.expand(h)
        for sub in range(2 * L):
            with label("residual-mix"):
                pre, post, res = self.mhc.coefficients(sub, x)
                u = (pre.unsqueeze(-1) * x).sum(-2)
            y = (attn if sub % 2 == 0 else ffn)(sub // 2, u)
            with label("residual-mix"):
                x = torch.matmul(res, x) + post.unsqueeze(-1) * y.unsqueeze(-2)
        return self.mhc.collapse(x)

    def forward(self, tokens, variant: str, *, cache=None, depth_grad: bool = True, last_only: bool = False):
        """Logits (B, T, vocab), or (B, 1, vocab) with last_only, of `tokens` (B, T) run as `variant`.
        With a cache: positions continue from cache.pos, and the cache advances by T."""
        if variant not in self.variants:
            raise ValueError(f"this Decoder was built for {', '.join(self.variants)}, not {variant!r}")
        B, T = tokens.shape
        pos = cache.pos if cache is not None else 0
        dev = tokens.device
        cos, sin = rope_tables(torch.arange(pos, pos + T, device=dev), self.cfg.head_dim, self.cfg.rope_theta,
                               self.embed.weight.dtype)
        depth_grad = bool(depth_grad) or ATTENTION_OF[variant] == "dattn"
        attached = torch.is_grad_enabled() and depth_grad
        depth = self.depth_buffer(variant, B, T, attached)
        seqlens = None
        if cache is not None and pos > 0 and ATTENTION_OF[variant] == "moda":
            seqlens = torch.full((B,), pos + T, dtype=torch.int32, device=dev)
        st = Step(variant, cos, sin, depth, depth_grad, cache, pos, seqlens)
        if depth is not None:
            st.token = depth.start(cos)
        h = self.body(self.embed(tokens), st)
        if last_only:
            h = h[:, -1:]
        with label("lm-head"):
            h = self.norm(h)
            logits = F.linear(h, self.embed.weight) if self.lm_head is None else self.lm_head(h)
        if cache is not None:
            cache.pos += T
        return logits

    def loss(self, tokens, variant: str, *, depth_grad: bool = True):
        """Mean next-token cross entropy (in float32) of tokens (B, T + 1): the first T are the
        input, the last T the targets."""
        logits = self(tokens[:, :-1], variant, depth_grad=depth_grad)
        with label("lm-head"):
            return F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
