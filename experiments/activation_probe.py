"""What a training step of `moda-bench model` holds per token, to size the model presets' batches
without a GPU: the activations autograd saves per token and layer for each variant, from two
short CPU forwards at the configuration's real width (2 and 3 layers, T tokens, float32; the
difference is one layer), halved for 16-bit runs; plus the weights, gradients and two AdamW
moments (8 bytes a parameter in fp16/bf16) and the LM head's logits and loss (10 bytes a token
and vocabulary entry: the 16-bit logits, their float32 copy and its gradient).

    TRITON_INTERPRET=1 python3 experiments/activation_probe.py --model dattn-1.5b --layers 24 --batch 8
    TRITON_INTERPRET=1 python3 experiments/activation_probe.py --model moda-700m --variants vanilla,moda

Saved tensors are counted once per storage (views share one), the parameters not (they are in
the 8 bytes). An estimate of the peak: it leaves out the backward's transients (gradients of the
layer being differentiated, the allocator's rounding), so a preset keeps a margin below the GPU.
The CPU's SDPA saves what flash attention does (output and log-sum-exp), so the attention part
holds for the GPU; the Triton kernels run under the interpreter (slow at large T).
"""
from __future__ import annotations

import argparse

import torch

from moda_bench.models import Decoder
from moda_bench.models.config import get_config
from moda_bench.models.flops import depth_kv_bytes, param_count


def saved_bytes(model: Decoder, variant: str, T: int) -> int:
    """Bytes of the distinct non-parameter storages autograd saves in one forward of 1 x T tokens."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    tokens = torch.randint(0, model.cfg.vocab, (1, T + 1))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.loss(tokens, variant)
    return sum(seen.values())


def per_token_layer(name: str, variant: str, T: int) -> float:
    """Saved float32 bytes per token and layer (3 layers minus 2)."""
    got = []
    for layers in (2, 3):
        cfg = get_config(name).with_layers(layers).replace(seq_len=T)
        torch.manual_seed(0)
        model = Decoder(cfg, (variant,), dtype=torch.float32)
        got.append(saved_bytes(model, variant, T))
    return (got[1] - got[0]) / T


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="dattn-1.5b")
    ap.add_argument("--variants", default="vanilla,depth-attention-torch,denseformer,attnres,mhc")
    ap.add_argument("--layers", type=int, default=0, help="layers of the run (default: the whole model)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=0, help="the run's T (default: the model's)")
    ap.add_argument("--probe-T", type=int, default=32, help="T of the CPU forwards")
    args = ap.parse_args()
    base = get_config(args.model)
    cfg = base.with_layers(args.layers) if args.layers else base
    T = args.seq_len or cfg.seq_len
    tokens = args.batch * T
    print(f"{args.model}: {cfg.layers} layers, B={args.batch}, T={T}, 16-bit; GB")
    for variant in args.variants.split(","):
        act = per_token_layer(args.model, variant, args.probe_T) / 2 * tokens * cfg.layers / 1e9
        state = 8 * param_count(cfg, variant) / 1e9
        head = 10 * tokens * cfg.vocab / 1e9
        depth = depth_kv_bytes(cfg, args.batch, T, 2, variant) * 2 / 1e9   # buffer and gradient buffer
        total = act + state + head + depth
        print(f"  {variant:22s} activations {act:6.1f}  weights+grads+AdamW {state:5.1f}  logits+loss {head:5.1f}  "
              f"depth KV {depth:5.2f}  total {total:6.1f}")


if __name__ == "__main__":
    main()
