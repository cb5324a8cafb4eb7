"""GPU probe of the fused MoDA kernel: median ms (p20/p80) of several kernel configurations
("variants": the heuristic default config with a few MoDAConfig fields changed, see VARIANTS)
against FA2 (SDPA flash backend) and cuDNN, all measured in one process at the same shape, per
pass (fwdbwd, fwd). `--l0-variants` also times those variants with L=0 (the fa2-triton path).
Use it to try a kernel idea before it becomes a config field the tuner searches; the CSVs in
results/h200/probes/ came from it (commands in that folder's run.json and docs/RUNBOOK.md).
Writes a CSV with its own columns (T, G, L, pass_, provider, median_ms, p20_ms, p80_ms,
ratio_fa2, status), not the moda-bench schema. Needs a CUDA GPU.

    PYTHONPATH=$PWD python3 experiments/kernel_probe.py --T 4096,16384 --G 8 --L 64 \
        --variants default,fused,split,stream --l0-variants default --passes fwdbwd,fwd --out probe.csv

(Without PYTHONPATH after `pip install -e .`.) Set MODA_BENCH_NO_TUNING=1 so nothing else
consults the tuning cache; the variants themselves always start from `default_config`.
"""
from __future__ import annotations

import argparse
import json

import pandas as pd
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from moda_bench.kernels.moda import MoDAConfig, moda_attention
from moda_bench.kernels.moda.validate import MoDAShape
from moda_bench.kernels.moda.config import FUSED_DEPTH_MAX_T, default_config, pointer_block_l
from moda_bench.timing import make_inputs, make_pass_fn, measure, grad_inputs

VARIANTS = {
    "default": {},
    "fused": dict(fwd_depth="fused", bwd_depth="fused"),  # depth phase inside the sequence programs
    "split": dict(fwd_depth="split", bwd_depth="split"),  # depth-only launches
    "overlap": dict(fwd_depth="overlap", bwd_depth="overlap"),  # depth programs inside the sequence grids
    "splitovl": dict(fwd_depth="split", bwd_depth="overlap"),
    "stream": dict(fwd_depth="stream", bwd_depth="stream"),
    "splitstr": dict(fwd_depth="split", bwd_depth="stream"),
    "stream128": dict(fwd_depth="stream", bwd_depth="stream", block_m=128, num_warps=8),
    "split128": dict(block_m=128, num_warps=8),
    "stw2": dict(bwd_depth_warps=2, bwd_depth_block_m=32, bwd_block_l=32),
    "stw2s1": dict(bwd_depth_warps=2, bwd_depth_block_m=32, bwd_block_l=32, bwd_depth_stages=1),
    "stw2f": dict(fwd_depth="stream", depth_warps=2, depth_block_m=32, block_l=32, bwd_depth_warps=2,
                  bwd_depth_block_m=32, bwd_block_l=32),
    "after": dict(fwd_depth="stream", bwd_depth="stream", depth_after=True, bwd_depth_after=True),
    "after_w2": dict(fwd_depth="stream", bwd_depth="stream", depth_after=True, bwd_depth_after=True,
                     depth_warps=2, depth_block_m=32, bwd_depth_warps=2, bwd_depth_block_m=32),
    "bwdafter": dict(bwd_depth_after=True),  # default forward, backward depth launched after dk/dv
    "rev": dict(reverse=True),
    "dbm128": dict(depth_block_m=128, depth_warps=8),
    "dbm32": dict(depth_block_m=32),
    "ds2": dict(depth_stages=2),
    "bl128": dict(block_l=128),
    "f128w8f": dict(block_m=128, num_warps=8),
    "dense": {"depth_sub": -1},  # paper's group-aware dense depth tile
    "bl32": dict(block_l=32),
    "f128w8": dict(block_m=128, block_n=64, num_warps=8, num_stages=3, bwd_q_block_m=128),
    "f128w4": dict(block_m=128, block_n=64, num_warps=4, num_stages=3, bwd_q_block_m=128),
    "f128n128": dict(block_m=128, block_n=128, num_warps=8, num_stages=3),
    "kv128w8": dict(bwd_kv_block_m=64, bwd_kv_block_n=128, bwd_kv_warps=8, bwd_kv_stages=3),
    "q128w8": dict(bwd_q_block_m=128, bwd_q_block_n=64, bwd_q_warps=8, bwd_q_stages=3),
    # the backward's descriptor loads (bwd_tma) alone and with wider tiles
    "btma": dict(bwd_tma=True),
    "btma-kv128": dict(bwd_tma=True, bwd_kv_block_m=64, bwd_kv_block_n=128, bwd_kv_warps=8, bwd_kv_stages=3),
    "btma-kv128s2": dict(bwd_tma=True, bwd_kv_block_m=64, bwd_kv_block_n=128, bwd_kv_warps=8, bwd_kv_stages=2),
    "btma-q128": dict(bwd_tma=True, bwd_q_block_m=128, bwd_q_block_n=64, bwd_q_warps=8, bwd_q_stages=3),
    "btma-both": dict(bwd_tma=True, bwd_kv_block_m=64, bwd_kv_block_n=128, bwd_kv_warps=8, bwd_kv_stages=3,
                      bwd_q_block_m=128, bwd_q_block_n=64, bwd_q_warps=8, bwd_q_stages=3),
    "kv128s2": dict(bwd_kv_block_m=64, bwd_kv_block_n=128, bwd_kv_warps=8, bwd_kv_stages=2),
    # the folded "tma" backward (kernel_bwd_tma, the Hopper default): "oldbwd" is the pointer
    # backward the default ran before it (fused up to T = 2048, else stream; set per T below)
    "oldbwd": dict(bwd_q_maxnreg=0, bwd_kv_maxnreg=0),
    "q0": dict(bwd_q_maxnreg=0),
    "kv0": dict(bwd_kv_maxnreg=0),
    "qn128": dict(bwd_q_block_n=128, bwd_q_maxnreg=0),
    "bbl64": dict(bwd_block_l=64),
    "bds3": dict(bwd_depth_stages=3),
    "g2fwd": dict(block_m=64, block_n=64, num_warps=4, num_stages=3, block_l=64),  # the shipped H100 G=2 forward
    "kvn128w8": dict(bwd_kv_block_n=128, bwd_kv_warps=8, bwd_kv_maxnreg=0),
}


def sdpa(backend, ins, G):
    def fwd():
        q, k, v = (ins[n].transpose(1, 2) for n in ("q", "k", "v"))
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=G > 1).transpose(1, 2)
    return fwd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", default="4096,16384")
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--L", type=int, default=64)
    ap.add_argument("--variants", default="default,fused,split,stream", help="names in VARIANTS")
    ap.add_argument("--passes", default="fwdbwd,fwd")
    ap.add_argument("--l0-variants", default="default", help="variants also timed with L = 0")
    ap.add_argument("--out", default="probe.csv")
    a = ap.parse_args()
    rows = []
    Hk, d, B = 8, 64, 1
    for T in [int(x) for x in a.T.split(",")]:
        G, L = a.G, a.L
        Hq = G * Hk
        shape = MoDAShape(B, T, Hq, Hk, d, L)
        for pass_ in a.passes.split(","):
            base = None
            ins = make_inputs(B, T, Hq, Hk, d, L, requires_grad=pass_ != "fwd")
            ins0 = dict(ins, k_depth=None, v_depth=None)
            provs = [("fa2", sdpa(SDPBackend.FLASH_ATTENTION, ins, G), ins0),
                     ("cudnn", sdpa(SDPBackend.CUDNN_ATTENTION, ins, G), ins0)]
            for vname in a.variants.split(","):
                kw = dict(VARIANTS[vname])
                cfg = default_config(shape).replace(**kw) if kw else default_config(shape)
                if vname == "oldbwd":
                    cfg = cfg.replace(bwd_depth="fused" if T <= FUSED_DEPTH_MAX_T else "stream",
                                      bwd_block_l=pointer_block_l(L))
                if kw.get("depth_sub") == -1:
                    cfg = cfg.replace(depth_sub=cfg.block_m // 8, bwd_q_block_m=cfg.block_m)
                provs.append((f"moda[{vname}]", (lambda c: lambda: moda_attention(ins["q"], ins["k"], ins["v"],
                              ins["k_depth"], ins["v_depth"], config=c))(cfg), ins))
                if vname in a.l0_variants.split(","):
                    provs.append((f"moda-L0[{vname}]", (lambda c: lambda: moda_attention(ins["q"], ins["k"], ins["v"],
                                  config=c))(cfg), ins0))
            for name, fwd, pins in provs:
                try:
                    fn = make_pass_fn(fwd, pins, pass_)
                    r = measure(fn, grad_to_none=grad_inputs(pins) if pass_ != "fwd" else None)
                    status = "ok"
                except Exception as e:  # noqa: BLE001 - probe: record and go on
                    r = {"median_ms": float("nan"), "p20_ms": float("nan"), "p80_ms": float("nan")}
                    status = f"error: {type(e).__name__}: {str(e)[:200]}"
                if name == "fa2":
                    base = r["median_ms"]
                row = dict(T=T, G=G, L=L, pass_=pass_, provider=name, **r, ratio_fa2=r["median_ms"] / base,
                           status=status)
                rows.append(row)
                print(f"T={T:6d} {pass_:7s} {name:18s} {r['median_ms']:9.3f} ms  x{row['ratio_fa2']:.3f}  {status}",
                      flush=True)
                torch.cuda.empty_cache()
    pd.DataFrame(rows).to_csv(a.out, index=False)


if __name__ == "__main__":
    main()
