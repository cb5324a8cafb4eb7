"""Issue 21 probe: Triton's automatic warp specialization on Hopper for the L=0 (sequence-only)
passes. Triton 3.5+ partitions a `tl.range(..., warp_specialize=True)` loop on sm90 into a TMA
producer and consumer warp groups, FA3's structure, which the package's kernels cannot express
today (one wgmma group in flight, PERFORMANCE rows 32 and 36). The pass is fragile: checked by
compiling for sm90 on the CPU (Triton 3.6), it fails on a loop after the specialised one, on a
descriptor load reshaped from 4-D (the folded-row layout) and on an `if` inside the loop; it
partitions a single causal loop that masks every step, with 2-D descriptors over the per-head
layout ([B*T, H*d], box [rows, d]). So these kernels are per head (not folded), mask every
step, and take T a multiple of their tiles:

  forward   grid (T/BM, B*Hq), heaviest blocks first; out, lse (B, Hq, T).
  dq pass   grid (T/BM, B*Hq): dq += ds k over keys <= the block's last row.
  kv pass   grid (T/BN, B*Hk): one loop over the G heads' row steps (step i -> head i // n,
            rows n0 + (i % n) * BM), dk and dv of the key tile summed over the group.
  delta = rowsum(o * do) and lse2 = lse * log2(e) by torch between them.

Each kernel also compiles with WS=False (the same loop, not specialised) for the comparison. A GPU
run checks out and the three gradients against the package (`moda_attention`, L=0) at T = 1024
and the timed T, then times interleaved (forward: graph timer; backward and its passes: eager,
GPU-bound at these sizes), against the package's own forward /
backward and cuDNN (SDPA), printing TFLOP/s (the suite's FLOP model: 4 Hq d T(T+1)/2 a batch
forward, 2.5x that backward) and one `WS PROBE:` line; never exits non-zero.

    PYTHONPATH=$PWD python3 experiments/ws_probe.py --T 16384 --max-time 3
    PYTHONPATH=$PWD python3 experiments/ws_probe.py --compile-only     # does the pass partition (any GPU)
"""
from __future__ import annotations

import argparse
import math
import traceback

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
NEG = tl.constexpr(-1.0e30)


@triton.jit
def _fwd(Q, K, V, O, LSE, B, T, Hq, Hk, G, qk_scale, BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr,
         WS: tl.constexpr):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    j = h // G
    qd = tl.make_tensor_descriptor(Q, shape=[B * T, Hq * D], strides=[Hq * D, 1], block_shape=[BM, D])
    od = tl.make_tensor_descriptor(O, shape=[B * T, Hq * D], strides=[Hq * D, 1], block_shape=[BM, D])
    kd = tl.make_tensor_descriptor(K, shape=[B * T, Hk * D], strides=[Hk * D, 1], block_shape=[BN, D])
    vd = tl.make_tensor_descriptor(V, shape=[B * T, Hk * D], strides=[Hk * D, 1], block_shape=[BN, D])
    t0 = pid_m * BM
    q = qd.load([b * T + t0, h * D])
    t = t0 + tl.arange(0, BM)
    m = tl.full([BM], NEG, tl.float32)
    li = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    for n in tl.range(0, t0 + BM, BN, warp_specialize=WS):
        k = kd.load([b * T + n, j * D])
        s = tl.dot(q, k.T) * qk_scale
        s = tl.where((n + tl.arange(0, BN))[None, :] <= t[:, None], s, NEG)
        mn = tl.maximum(m, tl.max(s, 1))
        p = tl.math.exp2(s - mn[:, None])
        a = tl.math.exp2(m - mn)
        li = li * a + tl.sum(p, 1)
        acc = acc * a[:, None]
        v = vd.load([b * T + n, j * D])
        acc = tl.dot(p.to(tl.bfloat16), v, acc)
        m = mn
    od.store([b * T + t0, h * D], (acc / li[:, None]).to(tl.bfloat16))
    tl.store(LSE + bh.to(tl.int64) * T + t, (m + tl.math.log2(li)) / 1.4426950408889634)


@triton.jit
def _dq(Q, K, V, DO, LSE2, DELTA, DQ, B, T, Hq, Hk, G, qk_scale, sm_scale, BM: tl.constexpr, BN: tl.constexpr,
        D: tl.constexpr, WS: tl.constexpr, O=None, LSE=None, STATS: tl.constexpr = False):
    """STATS: the rows' delta = rowsum(o*do) and lse2 computed here from O and LSE (o by pointers,
    as the package's dq pass does) and stored to DELTA, LSE2, instead of read from them."""
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    j = h // G
    qd = tl.make_tensor_descriptor(Q, shape=[B * T, Hq * D], strides=[Hq * D, 1], block_shape=[BM, D])
    dod = tl.make_tensor_descriptor(DO, shape=[B * T, Hq * D], strides=[Hq * D, 1], block_shape=[BM, D])
    dqd = tl.make_tensor_descriptor(DQ, shape=[B * T, Hq * D], strides=[Hq * D, 1], block_shape=[BM, D])
    kd = tl.make_tensor_descriptor(K, shape=[B * T, Hk * D], strides=[Hk * D, 1], block_shape=[BN, D])
    vd = tl.make_tensor_descriptor(V, shape=[B * T, Hk * D], strides=[Hk * D, 1], block_shape=[BN, D])
    t0 = pid_m * BM
    t = t0 + tl.arange(0, BM)
    q = qd.load([b * T + t0, h * D])
    do = dod.load([b * T + t0, h * D])
    if STATS:
        optr = ((b * T + t).to(tl.int64) * Hq + h)[:, None] * D + tl.arange(0, D)[None, :]
        o = tl.load(O + optr)
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
        lse2 = tl.load(LSE + bh.to(tl.int64) * T + t) * 1.4426950408889634
        tl.store(LSE2 + bh.to(tl.int64) * T + t, lse2)
        tl.store(DELTA + bh.to(tl.int64) * T + t, delta)
    else:
        lse2 = tl.load(LSE2 + bh.to(tl.int64) * T + t)
        delta = tl.load(DELTA + bh.to(tl.int64) * T + t)
    dq = tl.zeros([BM, D], tl.float32)
    for n in tl.range(0, t0 + BM, BN, warp_specialize=WS):
        k = kd.load([b * T + n, j * D])
        v = vd.load([b * T + n, j * D])
        s = tl.dot(q, k.T)
        p = tl.math.exp2(s * qk_scale - lse2[:, None])
        p = tl.where((n + tl.arange(0, BN))[None, :] <= t[:, None], p, 0.0)
        dp = tl.dot(do, v.T)
        ds = (p * (dp - delta[:, None])).to(tl.bfloat16)
        dq = tl.dot(ds, k, dq)
    dqd.store([b * T + t0, h * D], (dq * sm_scale).to(tl.bfloat16))


@triton.jit
def _kv(Q, K, V, DO, LSE2, DELTA, DK, DV, B, T, Hq, Hk, G, qk_scale, sm_scale, BM: tl.constexpr, BN: tl.constexpr,
        D: tl.constexpr, WS: tl.constexpr):
    tile = tl.program_id(0)  # the first key tiles see the most rows: they go first
    bj = tl.program_id(1)
    b = bj // Hk
    j = bj % Hk
    qd = tl.make_tensor_descriptor(Q, shape=[B * T, Hq * D], strides=[Hq * D, 1], block_shape=[BM, D])
    dod = tl.make_tensor_descriptor(DO, shape=[B * T, Hq * D], strides=[Hq * D, 1], block_shape=[BM, D])
    kd = tl.make_tensor_descriptor(K, shape=[B * T, Hk * D], strides=[Hk * D, 1], block_shape=[BN, D])
    vd = tl.make_tensor_descriptor(V, shape=[B * T, Hk * D], strides=[Hk * D, 1], block_shape=[BN, D])
    dkd = tl.make_tensor_descriptor(DK, shape=[B * T, Hk * D], strides=[Hk * D, 1], block_shape=[BN, D])
    dvd = tl.make_tensor_descriptor(DV, shape=[B * T, Hk * D], strides=[Hk * D, 1], block_shape=[BN, D])
    n0 = tile * BN
    kn = n0 + tl.arange(0, BN)
    k = kd.load([b * T + n0, j * D])
    v = vd.load([b * T + n0, j * D])
    dk = tl.zeros([BN, D], tl.float32)
    dv = tl.zeros([BN, D], tl.float32)
    steps = (T - n0) // BM
    for i in tl.range(0, G * steps, warp_specialize=WS):
        g = i // steps
        t0 = n0 + (i - g * steps) * BM
        h = j * G + g
        r = t0 + tl.arange(0, BM)
        q = qd.load([b * T + t0, h * D])
        do = dod.load([b * T + t0, h * D])
        row = (b * Hq + h).to(tl.int64) * T + r
        lse2 = tl.load(LSE2 + row)
        delta = tl.load(DELTA + row)
        sT = tl.dot(k, tl.trans(q))
        pT = tl.math.exp2(sT * qk_scale - lse2[None, :])
        pT = tl.where(kn[:, None] <= r[None, :], pT, 0.0)
        dv = tl.dot(pT.to(tl.bfloat16), do, dv)
        dpT = tl.dot(v, tl.trans(do))
        dsT = (pT * (dpT - delta[None, :])).to(tl.bfloat16)
        dk = tl.dot(dsT, q, dk)
    dkd.store([b * T + n0, j * D], (dk * sm_scale).to(tl.bfloat16))
    dvd.store([b * T + n0, j * D], dv.to(tl.bfloat16))


def ws_forward(q, k, v, G, *, bm=128, bn=64, warps=4, stages=2, ws=True):
    B, T, Hq, D = q.shape
    Hk = k.shape[2]
    o = torch.empty_like(q)
    lse = torch.empty((B, Hq, T), device=q.device, dtype=torch.float32)
    scale = D ** -0.5
    _fwd[(T // bm, B * Hq)](q, k, v, o, lse, B, T, Hq, Hk, G, scale * LOG2E, BM=bm, BN=bn, D=D, WS=ws,
                            num_warps=warps, num_stages=stages)
    return o, lse


def ws_backward(q, k, v, o, lse, do, G, *, q_tiles=(64, 64, 4, 2), kv_tiles=(64, 128, 4, 2), ws=True):
    B, T, Hq, D = q.shape
    Hk = k.shape[2]
    scale = D ** -0.5
    delta = (o.float() * do.float()).sum(-1).transpose(1, 2).contiguous()  # (B, Hq, T)
    lse2 = lse * LOG2E
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    bm, bn, w, s = q_tiles
    _dq[(T // bm, B * Hq)](q, k, v, do, lse2, delta, dq, B, T, Hq, Hk, G, scale * LOG2E, scale, BM=bm, BN=bn, D=D,
                           WS=ws, num_warps=w, num_stages=s)
    bm, bn, w, s = kv_tiles
    _kv[(T // bn, B * Hk)](q, k, v, do, lse2, delta, dk, dv, B, T, Hq, Hk, G, scale * LOG2E, scale, BM=bm, BN=bn, D=D,
                           WS=ws, num_warps=w, num_stages=s)
    return dq, dk, dv


def compile_only(args) -> None:
    """Compile each kernel for sm90 on any machine and say whether the loop was partitioned."""
    from triton.backends.compiler import GPUTarget
    for name, fn, sig_ptrs in (("fwd", _fwd, ("Q", "K", "V", "O")), ("dq", _dq, ("Q", "K", "V", "DO", "DQ", "O")),
                               ("kv", _kv, ("Q", "K", "V", "DO", "DK", "DV"))):
        names = fn.arg_names
        sig = {}
        for a in names:
            if a in ("BM", "BN", "D", "WS", "STATS"):
                sig[a] = "constexpr"
            elif a in sig_ptrs:
                sig[a] = "*bf16"
            elif a in ("LSE", "LSE2", "DELTA"):
                sig[a] = "*fp32"
            elif a in ("qk_scale", "sm_scale"):
                sig[a] = "fp32"
            else:
                sig[a] = "i32"
        tiles = {"fwd": (128, 64, 4, 2), "dq": (64, 64, 4, 2), "kv": (64, 128, 4, 2)}[name]
        for ws in (True, False):
            cx = dict(BM=tiles[0], BN=tiles[1], D=64, WS=ws, **({"STATS": not ws} if "STATS" in sig else {}))
            src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=cx)
            try:
                kern = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                      options={"num_warps": tiles[2], "num_stages": tiles[3]})
                part = "ttg.warp_specialize(" in kern.asm["ttgir"]
                print(f"compile {name} ws={ws}: partitioned={part} smem={kern.metadata.shared}")
            except Exception as e:  # the pass's failures end in a RuntimeError
                print(f"compile {name} ws={ws}: FAILED {str(e).splitlines()[-1][:120]}")


def _rel(a, b) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", default="16384")
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--Hk", type=int, default=8)
    ap.add_argument("--max-time", type=float, default=3.0)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--passes-only", action="store_true", help="skip the whole forward / backward comparison")
    ap.add_argument("--variants", default="ws;nows", help="';'-separated: ws | nows [,fwd=BMxBNwWsS][,dq=...][,kv=...]")
    args = ap.parse_args()
    if args.compile_only or not torch.cuda.is_available():
        compile_only(args)
        return
    from moda_bench.kernels.moda import moda_attention
    from moda_bench.kernels.moda.triton.fwd_tma import ensure_allocator
    from moda_bench.timing import RoundRule, time_interleaved
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    ensure_allocator()
    verdict = []

    def tiles(spec, default):
        bm, rest = spec.split("x")
        bn, rest = rest.split("w")
        w, s = rest.split("s")
        return (int(bm), int(bn), int(w), int(s)) if spec else default

    variants = []
    for v in args.variants.split(";"):
        parts = v.split(",")
        kw = {"ws": parts[0] == "ws", "fwd": (128, 64, 4, 2), "dq": (64, 64, 4, 2), "kv": (64, 128, 4, 2)}
        for p in parts[1:]:
            key, val = p.split("=")
            kw[key] = tiles(val, kw[key])
        variants.append((v, kw))
    for T in [int(x) for x in args.T.split(",")]:
        B, G, Hk, D = 1, args.G, args.Hk, 64
        Hq = G * Hk
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(B, T, h, D, device="cuda", generator=gen).to(torch.bfloat16) for h in (Hq, Hk, Hk, Hq))
        fwd_flops = 4.0 * B * Hq * D * T * (T + 1) / 2
        # the package at L=0 as the reference (its fp64 checks pass on the GPU)
        qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
        ref_o = moda_attention(qr, kr, vr)
        ref_o.backward(do)
        for name, kw in variants:
            try:
                o, lse = ws_forward(q, k, v, G, bm=kw["fwd"][0], bn=kw["fwd"][1], warps=kw["fwd"][2], stages=kw["fwd"][3], ws=kw["ws"])
                dq, dk, dv = ws_backward(q, k, v, o, lse, do, G, q_tiles=kw["dq"], kv_tiles=kw["kv"], ws=kw["ws"])
                torch.cuda.synchronize()
                errs = [_rel(o, ref_o.detach()), _rel(dq, qr.grad), _rel(dk, kr.grad), _rel(dv, vr.grad)]
                ok = all(e < 2e-2 for e in errs)
                print(f"check {name:40s} T={T}: out {errs[0]:.1e} dq {errs[1]:.1e} dk {errs[2]:.1e} dv {errs[3]:.1e} "
                      f"{'ok' if ok else 'MISMATCH'}", flush=True)
                kw["ok"] = ok
            except Exception:
                traceback.print_exc()
                print(f"check {name} T={T}: FAILED", flush=True)
                kw["ok"] = False
        rule = RoundRule(max_time_s=args.max_time, ci_tol=0.005)
        o_ref, lse_ref = ws_forward(q, k, v, G)
        if not args.passes_only:
            with torch.no_grad():
                fns = {"pkg": lambda: moda_attention(q, k, v)}
                for name, kw in variants:
                    if kw["ok"]:
                        fns[name] = (lambda kw=kw: ws_forward(q, k, v, G, bm=kw["fwd"][0], bn=kw["fwd"][1],
                                                              warps=kw["fwd"][2], stages=kw["fwd"][3], ws=kw["ws"]))
                try:
                    _sdpa(F, sdpa_kernel, SDPBackend, q, k, v)
                    fns["cudnn"] = lambda: _sdpa(F, sdpa_kernel, SDPBackend, q, k, v)
                except RuntimeError as e:
                    print(f"cudnn forward skipped: {str(e).splitlines()[0][:100]}")
                res = time_interleaved(fns, baseline="pkg", timer="graph", rule=rule)
            _print(res, "fwd", T, fwd_flops, verdict)
            pkg_o = moda_attention(qr, kr, vr)
            fns = {"pkg": lambda: pkg_o.backward(do, retain_graph=True)}
            for name, kw in variants:
                if kw["ok"]:
                    fns[name] = (lambda kw=kw: ws_backward(q, k, v, o_ref, lse_ref, do, G, q_tiles=kw["dq"],
                                                           kv_tiles=kw["kv"], ws=kw["ws"]))
            qc, kc, vc = (x.clone().requires_grad_() for x in (q, k, v))
            try:
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    cu_o = F.scaled_dot_product_attention(qc.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2),
                                                          is_causal=True, enable_gqa=True)
                cu_o.backward(do.transpose(1, 2), retain_graph=True)
                fns["cudnn"] = lambda: cu_o.backward(do.transpose(1, 2), retain_graph=True)
            except RuntimeError as e:
                print(f"cudnn backward skipped: {str(e).splitlines()[0][:100]}")
            res = time_interleaved(fns, baseline="pkg", timer="eager", rule=rule,  # autograd's backward: no capture
                                   grad_to_none={"pkg": [qr, kr, vr], "cudnn": [qc, kc, vc]})
            _print(res, "bwd", T, 2.5 * fwd_flops, verdict)
        # each pass alone, every variant's passes interleaved in one loop
        delta = (o_ref.float() * do.float()).sum(-1).transpose(1, 2).contiguous()
        lse2 = lse_ref * LOG2E
        dq = torch.empty_like(q)
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        fns = {}
        for name, kw in variants:
            if not kw["ok"]:
                continue
            bm, bn, w, s = kw["dq"]
            fns[name + " dq"] = (lambda bm=bm, bn=bn, w=w, s=s, ws=kw["ws"]: _dq[(T // bm, B * Hq)](
                q, k, v, do, lse2, delta, dq, B, T, Hq, Hk, G, D ** -0.5 * LOG2E, D ** -0.5, BM=bm, BN=bn, D=D, WS=ws,
                num_warps=w, num_stages=s))
            if not kw["ws"]:
                l2s, dls = torch.empty_like(lse2), torch.empty_like(delta)
                fns[name + " dq+stats"] = (lambda bm=bm, bn=bn, w=w, s=s, l2s=l2s, dls=dls: _dq[(T // bm, B * Hq)](
                    q, k, v, do, l2s, dls, dq, B, T, Hq, Hk, G, D ** -0.5 * LOG2E, D ** -0.5, BM=bm, BN=bn, D=D,
                    WS=False, O=o_ref, LSE=lse_ref, STATS=True, num_warps=w, num_stages=s))
            bm, bn, w, s = kw["kv"]
            fns[name + " kv"] = (lambda bm=bm, bn=bn, w=w, s=s, ws=kw["ws"]: _kv[(T // bn, B * Hk)](
                q, k, v, do, lse2, delta, dk, dv, B, T, Hq, Hk, G, D ** -0.5 * LOG2E, D ** -0.5, BM=bm, BN=bn, D=D,
                WS=ws, num_warps=w, num_stages=s))
        for n, fn in fns.items():  # registers and spills of each compiled pass
            kern = fn()
            print(f"regs {n:48s} {getattr(kern, 'n_regs', '?')} registers, {getattr(kern, 'n_spills', '?')} spilled, "
                  f"{kern.metadata.shared if hasattr(kern, 'metadata') else '?'} B shared", flush=True)
        if fns:
            res = time_interleaved(fns, timer="eager", rule=rule)
            for n, m in res.measurements.items():  # a pass's own FLOPs: dq 3 products, kv 4 (forward 2)
                print(f"pass {n:48s} T={T}: {m.median_ms:8.3f} ms {(2.0 if n.endswith('kv') else 1.5) * fwd_flops / m.median_ms / 1e9:6.1f} "
                      f"TFLOP/s of its products", flush=True)
    print("WS PROBE: " + "; ".join(verdict), flush=True)


def _sdpa(F, sdpa_kernel, SDPBackend, q, k, v):
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=True, enable_gqa=True)


def _print(res, pass_, T, flops, verdict) -> None:
    for name, m in res.measurements.items():
        r = res.ratios.get(name)
        rs = f"x{r[0]:.3f} [{r[1]:.3f}-{r[2]:.3f}] pkg" if r else "baseline"
        print(f"{pass_} T={T} {name:40s} {m.median_ms:8.3f} ms {flops / m.median_ms / 1e9:6.1f} TFLOP/s  {rs}", flush=True)
    best = min((m.median_ms, n) for n, m in res.measurements.items() if n not in ("pkg", "cudnn")) \
        if len(res.measurements) > 2 else (math.nan, "-")
    verdict.append(f"{pass_} T={T} best {best[1]} {flops / best[0] / 1e9:.0f} TFLOP/s vs pkg "
                   f"{flops / res.measurements['pkg'].median_ms / 1e9:.0f}")


if __name__ == "__main__":
    main()
