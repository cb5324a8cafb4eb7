"""Whole decoders for `moda-bench model`: configurations, the decoder stack and its variants,
the depth-KV buffer, generation with a KV cache, and parameter / model-FLOP counts.

`Decoder(cfg, variants)` (decoder.py) runs one set of weights as vanilla, MoDA, Depth-Attention
(fused or plain-PyTorch mix), DenseFormer, Block AttnRes or mHC; `CONFIGS` (config.py) holds the
seeds' sizes; `DepthKVBuffer` (depth.py) the one depth-KV store per model; `generate` /
`KVCache` (generate.py) the inference path; flops.py the counts MFU and the reports use.
"""
from moda_bench.models.config import CONFIGS, VARIANTS, ModelConfig, check_variant, get_config
from moda_bench.models.decoder import LABELS, Decoder
from moda_bench.models.depth import DepthKVBuffer
from moda_bench.models.generate import KVCache, generate, prefill

__all__ = ["CONFIGS", "VARIANTS", "ModelConfig", "check_variant", "get_config", "Decoder", "LABELS", "DepthKVBuffer",
           "KVCache", "generate", "prefill"]
