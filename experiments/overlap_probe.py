"""GPU probe of issue 20's overlap design: MoDA's depth part as a *capped, persistent* launch on
a high-priority side stream beside the sequence kernel (FA4 in moda-fa4), so that the depth bytes
stream on a fixed share of the SMs while the sequence kernel computes on the rest.

Why it could work where "stream" did not (docs/PERFORMANCE.md change 7, ANCHORS "Where the limit
is"): an uncapped depth launch has one program per row block; whichever of the two kernels is
issued second only fills the other's tail, and both runs took about the serial time. Capped at N
persistent programs (`MoDAConfig.depth_ctas`, `bwd_depth_ctas`) and placed first (highest stream
priority, `side_priority`), the depth part holds N slots for the whole pass and the sequence
kernel's programs take the others. The pass then costs about
max(seq * SMs / (SMs - N'), depth bytes / (N' * per-SM rate)) plus the merge, with N' the SMs
the N programs occupy; this script measures where that lands.

Variants (`--variants`, separated by ';'): `default` (moda-fa4's resolved config), `overlap`
(moda-overlap's, `overlap_config`, optionally followed by `,k=v` changes of it), or
`k=v,k=v` with MoDAConfig fields or the aliases f (depth_ctas), b (bwd_depth_ctas), p
(side_priority 0/1), dbm (depth_block_m and bwd_depth_block_m), dw (depth_warps and
bwd_depth_warps), bl (block_l and bwd_block_l), ds (bwd_depth_stages and depth_stages); in
`--alone-variants` also dbl (the persist kernels' block_l, depth columns a sub-tile per step:
more steps an item when smaller);
a variant that names f or b runs the forward/backward depth part as "stream" (concurrent).
`--depth-alone` also times the depth-only launches alone, capped at each `--ctas` value (their
per-program rate), of the kernels `--kernels` names: "persist" (`kernel_depth`, the streaming
kernels; the per-position items of the first probe runs are in git history, commit 4d4372e) and
"rowblock" (the row-block depth-only launches of `kernel_fwd`/`kernel_bwd`); `--seq cudnn` (no FA4 needed) replaces moda-fa4 by a contention test: cuDNN
fwd+bwd at L=0 on the main stream and the capped depth launches on the side stream.

Every number comes from `moda_bench.timing.time_interleaved` (interleaved rounds, L2 flushed,
ratios to the sequence-only baseline with 95% intervals). CSV with its own columns, not the
sweep schema. Needs CUDA.

    PYTHONPATH=$PWD python3 experiments/overlap_probe.py --T 16384 --passes fwd,fwdbwd \\
        --variants "default;f=16,b=16,p=1;f=32,b=32,p=1" --depth-alone --ctas 8,16,32,132
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time

import torch

from moda_bench.kernels.moda.config import MoDAConfig, resolve_config
from moda_bench.kernels.moda.triton.interface import Concurrent, moda_bwd, moda_fwd
from moda_bench.kernels.moda.triton.depth import depth_bwd, depth_fwd
from moda_bench.kernels.moda.fa4.overlap import overlap_config
from moda_bench.kernels.moda.validate import MoDAShape
from moda_bench.timing import RoundRule, grad_inputs, make_inputs, make_pass_fn, time_interleaved

ALIASES = {"f": ("depth_ctas",), "b": ("bwd_depth_ctas",), "p": ("side_priority",),
           "dbm": ("depth_block_m", "bwd_depth_block_m"), "dw": ("depth_warps", "bwd_depth_warps"),
           "bl": ("block_l", "bwd_block_l"), "ds": ("depth_stages", "bwd_depth_stages")}
BOOL_FIELDS = {"side_priority", "depth_after", "bwd_depth_after", "reverse", "bwd_tma", "fa4_fused_fwd"}


def parse_variant(text: str, base: MoDAConfig) -> MoDAConfig:
    if text.strip() == "default":
        return base
    kw = {}
    for item in text.split(","):
        k, v = item.split("=")
        for name in ALIASES.get(k.strip(), (k.strip(),)):
            kw[name] = bool(int(v)) if name in BOOL_FIELDS else (int(v) if v.strip().lstrip("-").isdigit() else v)
    persist = kw.pop("P", 0)
    cfg = base.replace(**kw)
    if persist:
        return cfg.replace(fwd_depth="persist", bwd_depth="persist")
    if "depth_ctas" in kw and "fwd_depth" not in kw and cfg.fwd_depth != "persist":
        cfg = cfg.replace(fwd_depth="stream")
    if "bwd_depth_ctas" in kw and "bwd_depth" not in kw and cfg.bwd_depth != "persist":
        cfg = cfg.replace(bwd_depth="stream")
    return cfg


def depth_launches(ins, shape, cfg, pass_, block_l: int = 0):
    """The depth-only launches alone (what moda-fa4 runs beside FA4), on the current stream;
    block_l: the persist kernels' depth columns a sub-tile per step (0: their own choice)."""
    q, k, v, kd, vd = (ins[n] for n in ("q", "k", "v", "k_depth", "v_depth"))
    scale = 1.0 / math.sqrt(shape.d)
    dcfg = cfg.replace(fwd_depth="split", bwd_depth="split")
    do = torch.randn_like(q)
    lse = torch.zeros(shape.B, shape.T, shape.Hq, device=q.device, dtype=torch.float32)
    delta = torch.zeros_like(lse)
    if cfg.fwd_depth == "persist":
        def run():
            if pass_ in ("fwd", "fwdbwd"):
                depth_fwd(q, kd, vd, scale, shape.G, cfg.depth_ctas, block_m=cfg.depth_block_m,
                          stages=cfg.depth_stages, num_warps=cfg.depth_warps, block_l=block_l)
            if pass_ in ("bwd", "fwdbwd"):
                depth_bwd(do, q, q, lse, kd, vd, scale, shape.G, cfg.bwd_depth_ctas, block_m=cfg.bwd_depth_block_m,
                          stages=cfg.bwd_depth_stages, num_warps=cfg.bwd_depth_warps, block_l=block_l)
        return run

    def run():
        if pass_ in ("fwd", "fwdbwd"):
            moda_fwd(q, k, v, kd, vd, scale, shape, dcfg, depth_only=True)
        if pass_ in ("bwd", "fwdbwd"):
            moda_bwd(do, q, k, v, kd, vd, q, lse, scale, shape, dcfg, depth_only=True, delta=delta)
    return run


def cudnn_fwdbwd(ins, pass_):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    q, k, v = (ins[n].detach().transpose(1, 2).requires_grad_(True) for n in ("q", "k", "v"))
    do = torch.randn_like(q)

    def run():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        if pass_ != "fwd":
            torch.autograd.grad(o, (q, k, v), do)
    return run


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", default="16384")
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--L", type=int, default=64)
    ap.add_argument("--Hk", type=int, default=8)
    ap.add_argument("--passes", default="fwd,fwdbwd")
    ap.add_argument("--variants", default="default;f=16,b=16,p=1")
    ap.add_argument("--seq", default="auto", help="fa4 | cudnn | auto (fa4 when importable)")
    ap.add_argument("--depth-alone", action="store_true")
    ap.add_argument("--ctas", default="8,16,32,66,132,0")
    ap.add_argument("--kernels", default="persist", help="depth kernels timed alone: persist, rowblock")
    ap.add_argument("--alone-variants", default="", help="';'-separated config changes for the kernels alone")
    ap.add_argument("--timer", default="eager")
    ap.add_argument("--depth-grad", choices=("on", "off"), default="on",
                    help="off: the depth K/V detached (no depth gradients computed or written)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="time every (T, pass) this many times in this process, the inputs allocated anew each "
                         "time behind a pad of 512 MiB x repeat index (where the depth tensors land in memory)")
    ap.add_argument("--max-time", type=float, default=12.0)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "overlap_probe.csv"))
    a = ap.parse_args()
    from moda_bench.kernels.moda.fa4.merge import fa4_attention, fa4_unavailable, moda_fa4
    seq = a.seq
    if seq == "auto":
        seq = "fa4" if fa4_unavailable() is None else "cudnn"
    print(f"# {torch.cuda.get_device_name()} SMs={torch.cuda.get_device_properties(0).multi_processor_count} "
          f"seq={seq} priorities={torch.cuda.Stream.priority_range()}", flush=True)
    f = open(a.out, "a", newline="")
    w = csv.writer(f)
    w.writerow(["T", "G", "L", "pass", "name", "config", "median_ms", "p20_ms", "p80_ms", "ratio", "lo", "hi",
                "stop", "repeat"])
    dev = torch.device("cuda")
    dg = a.depth_grad == "on"
    for T, rep in ((int(x), r) for x in a.T.split(",") for r in range(a.repeat)):
        shape = MoDAShape(1, T, a.G * a.Hk, a.Hk, 64, a.L)
        base = resolve_config(shape, torch.bfloat16, None, op="moda-fa4")
        pad = torch.empty(rep * 2**29, dtype=torch.uint8, device=dev) if rep else None  # noqa: F841 - held
        for pass_ in a.passes.split(","):
            ins = make_inputs(1, T, shape.Hq, a.Hk, 64, a.L, requires_grad=pass_ != "fwd")
            if not dg:
                ins = dict(ins, k_depth=ins["k_depth"].detach(), v_depth=ins["v_depth"].detach())
            ins0 = dict(ins, k_depth=None, v_depth=None)
            fns, cfgs, grads = {}, {}, {}
            if seq == "fa4":
                fns["fa4"] = make_pass_fn(lambda: fa4_attention(ins["q"], ins["k"], ins["v"]), ins0, pass_)
                grads["fa4"] = grad_inputs(ins0) if pass_ != "fwd" else None
            else:
                fns["cudnn"] = cudnn_fwdbwd(ins, pass_)
            for vtext in a.variants.split(";"):
                head, _, rest = vtext.strip().partition(",")
                cfg = parse_variant(rest or "default", overlap_config(shape, torch.bfloat16, dev)) \
                    if head == "overlap" else parse_variant(vtext, base)
                name = f"moda-fa4[{vtext}]" if seq == "fa4" else f"cudnn+depth[{vtext}]"
                cfgs[name] = cfg
                if seq == "fa4":
                    fns[name] = make_pass_fn((lambda c: lambda: moda_fa4(ins["q"], ins["k"], ins["v"], ins["k_depth"],
                                                                         ins["v_depth"], config=c, depth_grad=dg))(cfg), ins, pass_)
                    grads[name] = grad_inputs(ins) if pass_ != "fwd" else None
                else:
                    side, main_fn = depth_launches(ins, shape, cfg, pass_), fns["cudnn"]
                    hi = cfg.side_priority

                    def both(side=side, main_fn=main_fn, hi=hi):
                        conc = Concurrent(dev, hi)
                        with conc:
                            side()
                        main_fn()
                        conc.join()
                    fns[name] = both
            if a.depth_alone:
                for n in (int(x) for x in a.ctas.split(",")):
                    for kind in a.kernels.split(","):
                        for extra in a.alone_variants.split(";"):
                            cfg = base.replace(depth_ctas=n, bwd_depth_ctas=n)
                            keep = [x for x in extra.split(",") if x and not x.startswith("dbl=")]
                            dbl = next((int(x[4:]) for x in extra.split(",") if x.startswith("dbl=")), 0)  # not a field
                            if keep:
                                cfg = parse_variant(",".join(keep), cfg)
                            if kind == "persist":
                                if n == 0:
                                    continue
                                cfg = cfg.replace(fwd_depth="persist", bwd_depth="persist")
                            name = f"{kind}-alone[ctas={n}{',' + extra if extra else ''}]"
                            fns[name], cfgs[name] = depth_launches(ins, shape, cfg, pass_, dbl), cfg
            base_name = "fa4" if seq == "fa4" else "cudnn"
            t0 = time.time()
            try:
                res = time_interleaved(fns, baseline=base_name, timer=a.timer, grad_to_none=grads,
                                       rule=RoundRule(max_time_s=a.max_time))
            except Exception as exc:  # noqa: BLE001 - probe: report and go on
                print(f"T={T} {pass_}: failed: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                continue
            for name in fns:
                m = res.measurements[name]
                r, lo, hi = res.ratios.get(name, (1.0, 1.0, 1.0))
                c = cfgs.get(name)
                cdesc = "" if c is None else (f"fwd={c.fwd_depth} bwd={c.bwd_depth} f={c.depth_ctas} "
                                              f"b={c.bwd_depth_ctas} p={int(c.side_priority)} dbm={c.depth_block_m} "
                                              f"dw={c.depth_warps} ds={c.depth_stages}/{c.bwd_depth_stages} "
                                              f"dbm={c.depth_block_m}/{c.bwd_depth_block_m}")
                w.writerow([T, a.G, a.L, pass_, name, cdesc, f"{m.median_ms:.4f}", f"{m.p20_ms:.4f}",
                            f"{m.p80_ms:.4f}", f"{r:.4f}", f"{lo:.4f}", f"{hi:.4f}", res.stop_reason, rep])
                print(f"T={T:6d} {pass_:7s} {name:44s} {m.median_ms:8.3f} ms  x{r:.3f} [{lo:.3f}-{hi:.3f}]  {cdesc}",
                      flush=True)
            f.flush()
            print(f"# T={T} {pass_} repeat {rep}: {res.rounds} rounds, {time.time() - t0:.1f} s, {res.stop_reason}", flush=True)
            del fns, ins, ins0
            torch.cuda.empty_cache()
        del pad
        torch.cuda.empty_cache()
    f.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
