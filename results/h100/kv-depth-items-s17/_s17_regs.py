"""Temporary probe: registers, spills and shared memory of the backward kernels a config compiles."""
import sys
import torch
from moda_bench.ops.moda import moda_attention
from moda_bench.ops.moda.config import resolve_config
from moda_bench.ops.moda.validate import check_inputs
from moda_bench.ops.moda import kernel_bwd_tma as kb
from moda_bench.timing import make_inputs

T = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
x = make_inputs(1, T, 64, 8, 64, 64, seed=0)
ins = [x[n] for n in ("q", "k", "v", "k_depth", "v_depth")]
shape = check_inputs(*ins, need_cuda=True)
base = resolve_config(shape, ins[0].dtype)


def compiled(fn):
    out = {}
    for cache in fn.device_caches.values():
        table = cache[0] if isinstance(cache, tuple) else cache
        for key, k in table.items():
            out[key] = k
    return out


for name, cfg in [("items=0", base.replace(bwd_depth_items=0)), ("items=1", base.replace(bwd_depth_items=1)),
                  ("items=1,chunk=0", base.replace(bwd_depth_items=1, bwd_kv_chunk=0))]:
    before = {f: set(compiled(f)) for f in (kb._kv_kernel, kb._dq_kernel)}
    moda_attention(*ins, config=cfg).backward(x["do"])
    torch.cuda.synchronize()
    for f in (kb._kv_kernel, kb._dq_kernel):
        for key, k in compiled(f).items():
            if key not in before[f]:
                md = k.metadata
                print(f"{name:16s} {f.fn.__name__:12s} regs {k.n_regs:4d} spills {k.n_spills:4d} "
                      f"smem {getattr(md, 'shared', -1):7d} warps {md.num_warps} stages {md.num_stages}")
