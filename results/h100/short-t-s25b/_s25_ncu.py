"""Session 25: one fwd+bwd of moda at a short T per variant, each in an NVTX range v<i>/ for ncu,
after warm-up. Variants: the default (L=64), detached depth, and L=0 on the same folded kernels."""
import sys
import torch
torch.autograd.set_multithreading_enabled(False)  # the backward on this thread: inside the NVTX range
from moda_bench.ops.moda import moda_attention
from moda_bench.ops.moda.config import resolve_config
from moda_bench.ops.moda.validate import check_inputs
from moda_bench.timing import make_inputs

T = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
vs = []
for L, dg, extra in ((64, True, {}), (64, False, {}), (0, True, {"bwd_dq_heads": 0})):
    x = make_inputs(1, T, 64, 8, 64, L, seed=1)
    vs.append((L, dg, x, extra))
base = resolve_config(check_inputs(*(make_inputs(1, T, 64, 8, 64, 64, seed=1)[n] for n in ("q", "k", "v", "k_depth", "v_depth")),
                                   need_cuda=True), torch.bfloat16)
print("base config:", base)
for i, (L, dg, x, extra) in enumerate(vs):
    cfg = base.replace(**extra)
    def run():
        for n in ("q", "k", "v", "k_depth", "v_depth"):
            if x[n] is not None:
                x[n].grad = None
        moda_attention(x["q"], x["k"], x["v"], x["k_depth"], x["v_depth"], config=cfg, depth_grad=dg).backward(x["do"])
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    with torch.cuda.nvtx.range(f"v{i}"):
        run()
    torch.cuda.synchronize()
    print(f"v{i}: L={L} depth_grad={dg} {extra}")
