"""Which split count and tile the decode kernel wants where it is short of the copy rate (issue 22):
`moda_decode` at a few (B, T) points, over num_splits and DecodeConfig variants, timed like the suite
(CUDA-graph replays, L2 flushed before each), as GB/s of the bytes it must move and as a share of
a device copy's rate measured in the same process.

    python3 experiments/decode_probe.py [--points 1x32768,1x8192,8x8192,8x2048,32x2048] [--budget-s 100]
        [--block-n 64,128,256 --warps 2,4,8 --stages 2,3,4 --tma 0,1 --fused-combine 0,1 --pdl 0,1]
        [--splits 8,16,33] [--copy-floor]

Prints cuDNN's time per point (SDPA at L=0, the peer to beat), one line per (point, variant)
with its ratio to cuDNN, and the best variant per point; writes nothing.
"""
from __future__ import annotations

import argparse
import time

import torch
import triton
import triton.language as tl

from moda_bench import floor
from moda_bench.kernels.decode import DecodeConfig, choose_num_splits, moda_decode
from moda_bench.timing import StopRule, time_fn

G, HK, D, L = 8, 8, 64, 64
VARIANTS = [DecodeConfig(), DecodeConfig(block_n=64), DecodeConfig(num_warps=8), DecodeConfig(num_stages=4),
            DecodeConfig(block_n=64, num_stages=4)]


def point_inputs(text: str):
    """(B, T, q, k, v, k_depth, v_depth) of a point 'BxT': one new token, the preset's heads, bf16,
    seeded by the point (experiments/decode_ncu.py uses the same inputs)."""
    B, T = (int(x) for x in text.split("x"))
    g = torch.Generator(device="cuda").manual_seed(B * T)
    q = torch.randn(B, 1, G * HK, D, generator=g, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, T, HK, D, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    kd, vd = (torch.randn(B, 1, L, HK, D, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return B, T, q, k, v, kd, vd


def copy_gbps() -> float:
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    m = time_fn(lambda: dst.copy_(src), rule=StopRule(min_samples=10, min_time_s=0.05, max_time_s=0.5))
    return 2 * 2**30 / (m.median_ms * 1e6)


def grid_variants(args) -> list:
    """The DecodeConfig grid of --block-n x --warps x --stages x --tma x --fused-combine x --pdl (or VARIANTS
    when none is given), less the pairs fused_combine + pdl (DecodeConfig rejects them)."""
    if not (args.block_n or args.warps or args.stages or args.tma or args.fused_combine or args.pdl):
        return VARIANTS
    ints = lambda text, dflt: [int(x) for x in text.split(",")] if text else [dflt]  # noqa: E731
    return [DecodeConfig(block_n=bn, num_warps=w, num_stages=st, tma=bool(tma), fused_combine=bool(fc), pdl=bool(pdl))
            for bn in ints(args.block_n, 128) for w in ints(args.warps, 4) for st in ints(args.stages, 3)
            for tma in ints(args.tma, 0) for fc in ints(args.fused_combine, 0) for pdl in ints(args.pdl, 0)
            if not (fc and pdl)]


@triton.jit
def _read_kernel(X, OUT, n, chunk, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    """Program p sums X[p*chunk : (p+1)*chunk] (int32 words) in BLOCK-word tiles, STAGES in
    flight, and stores one number: a read-only stream with nothing else to wait for."""
    p = tl.program_id(0)
    start = p.to(tl.int64) * chunk
    acc = tl.zeros([BLOCK], tl.int32)
    for i in tl.range(0, chunk, BLOCK, num_stages=STAGES):
        offs = start + i + tl.arange(0, BLOCK)
        acc += tl.load(X + offs, mask=offs < n, other=0)
    tl.store(OUT + p, tl.sum(acc, 0))


@triton.jit
def _read_tma_kernel(X, OUT, rows, rows_per_prog, BR: tl.constexpr, W: tl.constexpr, STAGES: tl.constexpr):
    """As `_read_kernel`, through a tensor descriptor (TMA bulk copies on Hopper): program p sums
    rows [p*rows_per_prog, (p+1)*rows_per_prog) of X viewed as (rows, W) int32 words, BR rows a tile."""
    desc = tl.make_tensor_descriptor(X, shape=[rows, W], strides=[W, 1], block_shape=[BR, W])
    p = tl.program_id(0)
    acc = tl.zeros([BR, W], tl.int32)
    for r in tl.range(p * rows_per_prog, tl.minimum((p + 1) * rows_per_prog, rows), BR, num_stages=STAGES):
        acc += desc.load([r, 0])
    tl.store(OUT + p, tl.sum(tl.sum(acc, 1), 0))


def copy_floor(nbytes: int, rate: float, rule, tag: str) -> None:
    """Time kernels that move nbytes and do nothing else, as the decode step is timed (graph
    replays, L2 flushed): dst.copy_(src) of nbytes/2 (read + write = nbytes), torch's sum reading
    nbytes, and the best of small grids of Triton read-only streams (programs x tile x stages) with
    pointer loads (`_read_kernel`) and with descriptor loads (`_read_tma_kernel`); print their
    share of the canary's copy rate."""
    half = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(half)
    full = torch.ones(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    words = full.view(torch.int32)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    runs = [("copy", lambda: dst.copy_(half)), ("read (torch sum)", lambda: full.sum())]
    best = None
    for progs in (sms, 2 * sms, 4 * sms, 8 * sms):
        for block, stages in ((2048, 3), (4096, 3), (4096, 4), (8192, 2)):
            chunk = triton.cdiv(triton.cdiv(words.numel(), progs), block) * block
            out = torch.empty(progs, dtype=torch.int32, device="cuda")
            fn = (lambda progs=progs, chunk=chunk, out=out, block=block, stages=stages:
                  _read_kernel[(progs,)](words, out, words.numel(), chunk, BLOCK=block, STAGES=stages, num_warps=8))
            ms = time_fn(fn, timer="graph", rule=rule).median_ms
            if best is None or ms < best[0]:
                best = (ms, f"read (triton, {progs} programs, {block}-word tiles, {stages} stages)")
    from moda_bench.kernels.moda.triton.fwd_tma import ensure_allocator
    ensure_allocator()
    W = 256
    rows = words.numel() // W
    best_tma = None
    for progs in (sms, 2 * sms, 4 * sms):
        for br, stages in ((16, 3), (32, 3), (32, 4), (64, 2), (64, 3)):
            per = triton.cdiv(triton.cdiv(rows, progs), br) * br
            out = torch.empty(progs, dtype=torch.int32, device="cuda")
            fn = (lambda progs=progs, per=per, out=out, br=br, stages=stages:
                  _read_tma_kernel[(progs,)](words, out, rows, per, BR=br, W=W, STAGES=stages, num_warps=4))
            try:
                ms = time_fn(fn, timer="graph", rule=rule).median_ms
            except Exception as exc:  # noqa: BLE001 - a variant that fails is reported, not fatal
                print(f"{tag} read (tma, {progs} programs, {br} rows, {stages} stages): {type(exc).__name__}")
                continue
            if best_tma is None or ms < best_tma[0]:
                best_tma = (ms, f"read (tma, {progs} programs, {br}x{W}-word tiles, {stages} stages)")
    for name, fn in runs:
        m = time_fn(fn, timer="graph", rule=rule)
        gbps = nbytes / (m.median_ms * 1e6)
        print(f"{tag} {name} of {nbytes / 1e6:.1f} MB: {m.median_ms * 1e3:8.1f} us {gbps:6.0f} GB/s {gbps / rate:5.0%}")
    for b in filter(None, (best, best_tma)):
        gbps = nbytes / (b[0] * 1e6)
        print(f"{tag} best {b[1]} of {nbytes / 1e6:.1f} MB: {b[0] * 1e3:8.1f} us {gbps:6.0f} GB/s {gbps / rate:5.0%}")


def cudnn_ms(q, k, v, rule) -> float | None:
    """SDPA's cuDNN backend at L=0 on the same cache (the peer to beat), graph timer; None if it cannot run."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def run():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
    try:
        return time_fn(run, timer="graph", rule=rule).median_ms
    except Exception as exc:  # noqa: BLE001
        print(f"cudnn: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
        return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--points", default="1x32768,1x8192,8x8192,8x2048,32x2048")
    p.add_argument("--budget-s", type=float, default=100.0, help="for all points together")
    p.add_argument("--block-n", default="", help="comma list: a grid of DecodeConfig block_n (with --warps, --stages)")
    p.add_argument("--warps", default="")
    p.add_argument("--stages", default="")
    p.add_argument("--tma", default="", help="0,1: pointer loads and/or tensor-descriptor (TMA) loads of the cache")
    p.add_argument("--fused-combine", default="", help="0,1: the combine as its own launch and/or merged by the last "
                   "split program (DecodeConfig.fused_combine)")
    p.add_argument("--pdl", default="", help="0,1: the combine launched plainly and/or with Programmatic Dependent "
                   "Launch (DecodeConfig.pdl; sm_90+, else the same launches)")
    p.add_argument("--splits", default="", help="comma list of num_splits (default: around the chooser's)")
    p.add_argument("--copy-floor", action="store_true",
                   help="also time, per point, plain kernels that move the point's bytes (a copy of half of them, "
                        "torch's sum and the best of a grid of Triton read-only streams over all of them), same timer: "
                        "the share of the copy rate a transfer of that size reaches at all")
    args = p.parse_args()
    rate = copy_gbps()
    print(f"copy rate {rate:.0f} GB/s")
    t0 = time.time()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rule = StopRule(min_samples=20, min_time_s=0.02, max_time_s=0.3)
    variants = grid_variants(args)
    for text in args.points.split(","):
        B, T, q, k, v, kd, vd = point_inputs(text)
        nbytes = floor.decode_work(B, T, 1, G * HK, HK, D, L).bytes
        ref = cudnn_ms(q, k, v, rule)
        print(f"B={B:3d} T={T:6d} cudnn (L=0): " + (f"{ref * 1e3:8.1f} us" if ref else "-"))
        if args.copy_floor:
            copy_floor(nbytes, rate, rule, f"B={B:3d} T={T:6d}")
        auto = choose_num_splits(B, HK, T, sms, 128)
        if args.splits:
            splits = sorted({int(x) for x in args.splits.split(",")} | {auto})
        else:
            splits = sorted({1, auto, max(1, auto // 2), auto * 2, max(1, sms // (B * HK)), max(1, 4 * sms // (B * HK))})
        best = None
        for cfg in variants:
            for s in splits:
                if time.time() - t0 > args.budget_s:
                    print("budget spent")
                    return
                try:
                    m = time_fn(lambda: moda_decode(q, k, v, kd, vd, num_splits=s, config=cfg), timer="graph", rule=rule)
                except Exception as exc:  # noqa: BLE001 - a variant that fails is reported, not fatal
                    print(f"B={B} T={T} splits={s} {cfg}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
                    continue
                gbps = nbytes / (m.median_ms * 1e6)
                tag = (f"B={B:3d} T={T:6d} splits={s:4d} bn={cfg.block_n} w={cfg.num_warps} st={cfg.num_stages}"
                       + (" tma" if cfg.tma else "") + (" fc" if cfg.fused_combine else "") + (" pdl" if cfg.pdl else ""))
                vs = f" x{m.median_ms / ref:.3f} cudnn" if ref else ""
                dflt = " (default)" if s == auto and cfg == DecodeConfig() else ""
                print(f"{tag}: {m.median_ms * 1e3:8.1f} us {gbps:6.0f} GB/s {gbps / rate:5.0%}{vs}{dflt}")
                if best is None or gbps > best[0]:
                    best = (gbps, tag, m.median_ms)
        if best:
            vs = f", x{best[2] / ref:.3f} cudnn" if ref else ""
            print(f"best at B={B} T={T}: {best[1]}: {best[0]:.0f} GB/s ({best[0] / rate:.0%}{vs})")


if __name__ == "__main__":
    main()
