"""Model configurations of `moda-bench model` and the variants a model runs as.

`ModelConfig` is one decoder's shape (Qwen3-style: RMSNorm, GQA attention with q/k norms and
RoPE, SwiGLU FFN). `CONFIGS` holds the seeds' sizes: seed 002's 1.5B and 3B (its Table 8),
seed 000's 700M (its width, GQA group, sequence length, depth and parameter count fix the rest:
tied embeddings of the OLMo2 vocabulary and a 4096-wide FFN give its 669.0M) and a 1.5B of
ours in the same family (the seed gives no shape for it), plus `smoke`, a CPU-sized one.
docs/MODELS.md says where each number comes from.

`VARIANTS`: what a decoder runs as. vanilla, moda, depth-attention (the fused mix) and
depth-attention-torch (its plain-PyTorch mix) differ in their attention; denseformer, attnres
and mhc (seed 002's cross-layer baselines, Table 7) in how blocks are connected, with vanilla
attention.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

VARIANTS = ("vanilla", "moda", "depth-attention", "depth-attention-torch", "denseformer", "attnres", "mhc")
ATTENTION_OF = {"vanilla": "vanilla", "moda": "moda", "depth-attention": "dattn", "depth-attention-torch": "dattn",
                "denseformer": "vanilla", "attnres": "vanilla", "mhc": "vanilla"}
RESIDUAL_OF = {"denseformer": "denseformer", "attnres": "attnres", "mhc": "mhc"}   # others: the plain residual
ATTNRES_BLOCKS = 8     # Block AttnRes: stored block representations (seed 002, Table 7)
MHC_STREAMS = 4        # mHC expansion rate n (seed 002, Table 7)
MHC_SINKHORN_ITERS = 20


@dataclass(frozen=True)
class ModelConfig:
    """One decoder. dattn_stride: Depth-Attention's source stride s (layer l mixes layers l - s,
    l - 2s, ...); layers_total: the configuration's full depth (a run of fewer `layers` keeps
    it, so its FLOPs and step time can be scaled back to the whole model)."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    seq_len: int
    dtype: str
    tie_embeddings: bool
    dattn_stride: int
    source: str = ""
    layers_total: int = 0
    rms_eps: float = 1e-5
    rope_theta: float = 1e6

    def __post_init__(self):
        if self.layers_total == 0:
            object.__setattr__(self, "layers_total", self.layers)
        for name in ("hidden", "intermediate", "layers", "heads", "kv_heads", "vocab", "seq_len", "dattn_stride"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"hidden ({self.hidden}) must divide by heads ({self.heads}) and heads by kv_heads "
                             f"({self.kv_heads})")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def replace(self, **kw) -> "ModelConfig":
        return dataclasses.replace(self, **kw)

    def with_layers(self, layers: int) -> "ModelConfig":
        """This configuration run with `layers` of its layers_total (Depth-Attention's stride and
        AttnRes's blocks follow the run's depth: s = layers / 2 as seed 002 sets it)."""
        if not 1 <= layers <= self.layers_total:
            raise ValueError(f"--layers must be between 1 and {self.layers_total} for {self.name}, got {layers}")
        stride = max(1, self.dattn_stride * layers // self.layers_total)
        return self.replace(layers=layers, dattn_stride=stride)


CONFIGS: dict[str, ModelConfig] = {
    "smoke": ModelConfig("smoke", hidden=128, intermediate=256, layers=4, heads=4, kv_heads=2, vocab=512, seq_len=64,
                         dtype="float32", tie_embeddings=False, dattn_stride=2, source="ours: a CPU-sized decoder"),
    "dattn-1.5b": ModelConfig("dattn-1.5b", hidden=1536, intermediate=4096, layers=48, heads=24, kv_heads=6,
                              vocab=50304, seq_len=2048, dtype="float16", tie_embeddings=False, dattn_stride=24,
                              source="seed 002 Table 8"),
    "dattn-3b": ModelConfig("dattn-3b", hidden=2048, intermediate=6912, layers=48, heads=32, kv_heads=8, vocab=50304,
                            seq_len=2048, dtype="float16", tie_embeddings=False, dattn_stride=24,
                            source="seed 002 Table 8"),
    "moda-700m": ModelConfig("moda-700m", hidden=1024, intermediate=4096, layers=36, heads=16, kv_heads=8,
                             vocab=100352, seq_len=4096, dtype="bfloat16", tie_embeddings=True, dattn_stride=18,
                             source="seed 000 (D=1024, G=2, T=4096, 36 layers, 669.0M); FFN width and vocab ours"),
    "moda-1.5b": ModelConfig("moda-1.5b", hidden=1536, intermediate=6144, layers=36, heads=24, kv_heads=12,
                             vocab=100352, seq_len=4096, dtype="bfloat16", tie_embeddings=True, dattn_stride=18,
                             source="ours: seed 000 names a 1.5B but not its shape"),
}


def get_config(name: str) -> ModelConfig:
    """The named configuration, else ValueError listing them."""
    try:
        return CONFIGS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(CONFIGS)}") from None


def check_variant(name: str) -> str:
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; known: {', '.join(VARIANTS)}")
    return name


def moda_depth_entries(layer: int) -> int:
    """Depth entries MoDA's layer `layer` (0-based) reads: the attention K/V and the FFN's K/V
    projection of each earlier layer (seed 000's default, row 4 of its variants table)."""
    return 2 * layer


def moda_buffer_entries(layers: int) -> int:
    """Entries of a model's depth-KV buffer: what its last layer reads (the last layer's own
    K/V and FFN projection are read by nobody and have no slot)."""
    return moda_depth_entries(layers - 1)


def dattn_buffer_entries(layers: int, stride: int) -> int:
    """Entries of Depth-Attention's buffer: layer i's keys and mixed values are kept only where a
    later layer reads them (i + stride < layers), and those are the layers i < layers - stride."""
    return max(0, layers - stride)


def dattn_sources(layer: int, stride: int) -> list[int]:
    """Depth-Attention's source layers of `layer`: layer - s, layer - 2s, ... >= 0, ascending."""
    return list(range(layer % stride, layer, stride)) if stride >= 1 else []


def attnres_block_size(layers: int) -> int:
    """Sublayers (attention and FFN each count one) per Block AttnRes block: 2L / 8, at least 1."""
    return max(1, 2 * layers // ATTNRES_BLOCKS)
