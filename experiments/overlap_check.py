"""GPU check of moda-overlap's results on full tensors at long T (issue 20's open question: the
tuner's full-tensor check at T=32768 on an H100 saw moda-overlap's gradients differ by 2.0-3.0%
relative from the default config's when only the forward program count changed).

Three levels, each printed as one line per tensor and written to a CSV:

1. `depth`: the streaming depth kernels alone (`kernel_depth.depth_fwd`, `depth_bwd`) at each
   program count of `--programs`, against an fp32 reference of the depth part computed here in
   chunks of positions (o_d, lse_d of every row over its L depth keys; the depth share of dq and
   dk_depth, dv_depth given that o and lse). Also bitwise equality across program counts and
   across two runs of the same count. Rows whose relative error passes `--bad` are counted and
   their first positions printed (an error confined to some items shows where).
2. `full` (FA4 installed): `moda_overlap` at each program count against `moda_fa4`'s default
   (the unfused reference), out and all five gradients, and moda-fa4 against itself (run to run
   noise of FA4's backward).
3. `--determinism` (FA4 installed), instead of the two: which part varies from run to run (FA4's
   forward alone, the depth partial alone, FA4 + depth + merge in order, moda-fa4's and
   moda-overlap's whole forward, and `out` cloned before and after the backward), each against
   an fp32 reference of 32 sampled positions (all heads).

    PYTHONPATH=$PWD python3 experiments/overlap_check.py --T 32768,4099 --programs 4,8,10,132 --out o.csv
"""
from __future__ import annotations

import argparse
import csv
import math
import sys

import torch

from moda_bench.kernels.moda.triton.depth import depth_bwd, depth_fwd
from moda_bench.timing import make_inputs, max_rel_err


def depth_reference(q, kd, vd, do, o, lse, scale: float, G: int, chunk: int = 512):
    """fp32 (o_d, lse_d, dq_d, dkd, dvd) of the depth part; o, lse the merged ones for the backward."""
    B, T, Hq, d = q.shape
    L, Hk = kd.shape[2], kd.shape[3]
    od = torch.empty(B, T, Hq, d, device=q.device, dtype=torch.float32)
    lsed = torch.empty(B, T, Hq, device=q.device, dtype=torch.float32)
    dq = torch.empty_like(od)
    dkd = torch.empty(B, T, L, Hk, d, device=q.device, dtype=torch.float32)
    dvd = torch.empty_like(dkd)
    for t0 in range(0, T, chunk):
        sl = slice(t0, min(T, t0 + chunk))
        qc = q[:, sl].float().reshape(B, -1, Hk, G, d)
        kc, vc = kd[:, sl].float(), vd[:, sl].float()
        s = torch.einsum("btjgd,btljd->btjgl", qc, kc) * scale
        lse_c = torch.logsumexp(s, -1)
        p = torch.softmax(s, -1)
        od[:, sl] = torch.einsum("btjgl,btljd->btjgd", p, vc).reshape(B, -1, Hq, d)
        lsed[:, sl] = lse_c.reshape(B, -1, Hq)
        doc = do[:, sl].float().reshape(B, -1, Hk, G, d)
        oc = o[:, sl].float().reshape(B, -1, Hk, G, d)
        pm = torch.exp(s - lse[:, sl].float().reshape(B, -1, Hk, G)[..., None])
        delta = (oc * doc).sum(-1)
        dp = torch.einsum("btjgd,btljd->btjgl", doc, vc)
        ds = pm * (dp - delta[..., None])
        dq[:, sl] = (scale * torch.einsum("btjgl,btljd->btjgd", ds, kc)).reshape(B, -1, Hq, d)
        dkd[:, sl] = scale * torch.einsum("btjgl,btjgd->btljd", ds, qc)
        dvd[:, sl] = torch.einsum("btjgl,btjgd->btljd", pm, doc)
    return od, lsed, dq, dkd, dvd


def bad_rows(got, ref, bad: float):
    """(count, first positions) of rows (all but the last dim) whose relative error passes `bad`."""
    g, r = got.float().reshape(-1, got.shape[-1]) if got.dim() > 1 else got.float()[:, None], \
        ref.float().reshape(-1, ref.shape[-1]) if ref.dim() > 1 else ref.float()[:, None]
    err = (g - r).norm(dim=-1) / r.norm(dim=-1).clamp_min(1e-6)
    idx = torch.nonzero(err > bad).flatten()
    return int(idx.numel()), idx[:6].tolist()


def level_depth(T, G, L, programs, bad, rows, args):
    Hk, d = args.Hk, args.d
    x = make_inputs(1, T, G * Hk, Hk, d, L, device=args.device, requires_grad=False, seed=11)
    q, kd, vd, do = x["q"], x["k_depth"], x["v_depth"], x["do"]
    scale = d ** -0.5
    with torch.no_grad():
        od0, lse0 = depth_fwd(q, kd, vd, scale, G, programs[0])
        ref = depth_reference(q, kd, vd, do, od0, lse0, scale, G)
        first = None
        for n in programs:
            for rep in range(args.reps):
                od, lsed = depth_fwd(q, kd, vd, scale, G, n)
                dq, dkd, dvd = depth_bwd(do, q, od0, lse0, kd, vd, scale, G, n)
                outs = {"o_d": od, "lse_d": lsed, "dq_d": dq, "dk_depth": dkd, "dv_depth": dvd}
                if first is None:
                    first = {k: v.clone() for k, v in outs.items()}
                for (name, got), r in zip(outs.items(), ref):
                    nbad, where = bad_rows(got, r, bad)
                    row = dict(level="depth", T=T, G=G, L=L, programs=n, rep=rep, tensor=name,
                               rel_err=max_rel_err(got.float(), r), max_abs=float((got.float() - r).abs().max()),
                               bitwise_same_as_first=bool(torch.equal(got, first[name])), bad_rows=nbad,
                               first_bad=" ".join(map(str, where)))
                    rows.append(row)
                    print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                          flush=True)
    del x, ref
    torch.cuda.empty_cache()


def level_full(T, G, L, programs, rows, args):
    from moda_bench.kernels.moda.fa4.merge import moda_fa4
    from moda_bench.kernels.moda.fa4.overlap import moda_overlap, overlap_config
    from moda_bench.kernels.moda.validate import MoDAShape
    Hk, d = args.Hk, args.d
    x = make_inputs(1, T, G * Hk, Hk, d, L, device=args.device, requires_grad=True, seed=5)
    leaves = [x[k] for k in ("q", "k", "v", "k_depth", "v_depth")]

    def run(fn):
        for t in leaves:
            t.grad = None
        out = fn(*leaves)
        out.backward(x["do"])
        res = [out.detach().clone()] + [t.grad.detach().clone() for t in leaves]
        for t in leaves:
            t.grad = None
        return res

    names = ["out", "dq", "dk", "dv", "dk_depth", "dv_depth"]
    ref = run(lambda *a: moda_fa4(*a))
    shape = MoDAShape(B=1, T=T, Hq=G * Hk, Hk=Hk, d=d, L=L)
    base = overlap_config(shape, torch.bfloat16, torch.device("cuda"))
    cands = [("moda-fa4", None)] + [(f"overlap-{n}", base.replace(depth_ctas=n, bwd_depth_ctas=max(n, 8)))
                                    for n in programs] + [("overlap-default", base)]
    for label, cfg in cands:
        for rep in range(args.reps):
            got = run(lambda *a: moda_fa4(*a)) if cfg is None else run(lambda *a: moda_overlap(*a, config=cfg))
            for name, g, r in zip(names, got, ref):
                row = dict(level="full", T=T, G=G, L=L, programs=label, rep=rep, tensor=name,
                           rel_err=max_rel_err(g, r), max_abs=float((g.float() - r.float()).abs().max()),
                           bitwise_same_as_first=bool(torch.equal(g, r)), bad_rows=-1, first_bad="")
                rows.append(row)
                print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                      flush=True)
    del x, ref
    torch.cuda.empty_cache()


def sampled_reference(x, scale: float, G: int, positions):
    """fp32 MoDA output (n, Hq, d) of the rows at `positions` (all heads): causal sequence keys
    0..t and the row's own L depth keys under one softmax."""
    q, k, v, kd, vd = (x[n].detach() for n in ("q", "k", "v", "k_depth", "v_depth"))
    outs = []
    for t in positions:
        qt = q[0, t].float().reshape(-1, G, q.shape[-1])                      # Hk, G, d
        ks = torch.cat([k[0, :t + 1].float(), kd[0, t].float()], 0)             # t+1+L, Hk, d
        vs = torch.cat([v[0, :t + 1].float(), vd[0, t].float()], 0)
        s = torch.einsum("jgd,njd->jgn", qt, ks) * scale
        outs.append(torch.einsum("jgn,njd->jgd", torch.softmax(s, -1), vs).reshape(-1, q.shape[-1]))
    return torch.stack(outs)


def level_determinism(T, G, L, rows, args):
    """Which part varies run to run: FA4's forward alone, the depth partial, the merge, the whole
    forward of moda-fa4 and moda-overlap, and `out` before and after the backward."""
    from moda_bench.kernels.moda.fa4.merge import FA4_BACKEND, _merge, moda_fa4
    from moda_bench.kernels.moda.fa4.overlap import moda_overlap
    Hk, d = args.Hk, args.d
    scale = d ** -0.5
    x = make_inputs(1, T, G * Hk, Hk, d, L, device=args.device, requires_grad=True, seed=5)
    leaves = [x[k] for k in ("q", "k", "v", "k_depth", "v_depth")]
    q, k, v, kd, vd = (t.detach() for t in leaves)
    gen = torch.Generator().manual_seed(3)
    pos = sorted(set([0, 1, T // 2, T - 1] + torch.randint(0, T, (28,), generator=gen).tolist()))
    ref = sampled_reference(x, scale, G, pos)

    def record(what, rep, got, first):
        sample = got[0, pos].float()
        row = dict(level="determinism", T=T, G=G, L=L, programs=what, rep=rep, tensor="out",
                   rel_err=max_rel_err(sample, ref), max_abs=float((sample - ref).abs().max()),
                   bitwise_same_as_first=bool(torch.equal(got, first)), bad_rows=-1, first_bad="")
        rows.append(row)
        print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)

    from moda_bench.kernels.moda.config import resolve_config
    from moda_bench.kernels.moda.validate import MoDAShape
    split_cfg = resolve_config(MoDAShape(B=1, T=T, Hq=G * Hk, Hk=Hk, d=d, L=L), q.dtype, op="moda-fa4").replace(
        fwd_depth="split", bwd_depth="split")  # everything on one stream, in order
    with torch.no_grad():
        cases = {
            "fa4-fwd-alone": lambda: FA4_BACKEND.fwd(q, k, v, scale)[0].clone(),
            "depth-fwd-alone": lambda: depth_fwd(q, kd, vd, scale, G, 16)[0].clone(),
            "moda-fa4-fwd": lambda: moda_fa4(q, k, v, kd, vd).clone(),
            "moda-overlap-fwd": lambda: moda_overlap(q, k, v, kd, vd).clone(),
            "moda-fa4-split-fwd": lambda: moda_fa4(q, k, v, kd, vd, config=split_cfg).clone(),
        }

        def staged():  # FA4, then the depth partial, then the merge, all on one stream in order
            o, lse = FA4_BACKEND.fwd(q, k, v, scale)
            torch.cuda.synchronize()
            od, lsed = depth_fwd(q, kd, vd, scale, G, 16)
            torch.cuda.synchronize()
            o = _merge(o, lse, od, lsed)[0]
            torch.cuda.synchronize()
            return o.clone()
        cases["serial-merge"] = staged
        for what, fn in cases.items():
            first = fn()
            for rep in range(3):
                got = first if rep == 0 else fn()
                if what.endswith("alone"):  # partials: no reference, bitwise only
                    rows.append(dict(level="determinism", T=T, G=G, L=L, programs=what, rep=rep, tensor="partial",
                                     rel_err=math.nan, max_abs=math.nan,
                                     bitwise_same_as_first=bool(torch.equal(got, first)), bad_rows=-1, first_bad=""))
                    print(f"{what} rep={rep} bitwise_same_as_first={torch.equal(got, first)}", flush=True)
                else:
                    record(what, rep, got, first)
    for label, fn in (("moda-fa4", moda_fa4), ("moda-overlap", moda_overlap)):
        first = None
        for rep in range(3):
            for t in leaves:
                t.grad = None
            out = fn(*leaves)
            before = out.detach().clone()
            out.backward(x["do"])
            torch.cuda.synchronize()
            after = out.detach().clone()
            first = before if first is None else first
            record(label + "-before-bwd", rep, before, first)
            record(label + "-after-bwd", rep, after, before)
    del x
    torch.cuda.empty_cache()


def level_lse(T, G, L, rows, args):
    """FA4's lse and the merge at full size: FA4's forward into lse buffers pre-filled with NaN and
    with 7.0 (rows it leaves unwritten keep them), its lse against an fp32 logsumexp of sampled
    rows, the merge kernel twice on the same inputs, and where two moda_fa4 forwards differ."""
    from flash_attn.cute.interface import _flash_attn_fwd

    from moda_bench.kernels.moda.fa4.merge import _merge, moda_fa4
    Hk, d = args.Hk, args.d
    scale = d ** -0.5
    x = make_inputs(1, T, G * Hk, Hk, d, L, device=args.device, requires_grad=False, seed=5)
    q, k, v, kd, vd = (x[n] for n in ("q", "k", "v", "k_depth", "v_depth"))
    Hq = G * Hk

    def say(**kw):
        row = dict(level="lse", T=T, G=G, L=L, programs=kw.pop("what"), rep=kw.pop("rep", 0), tensor=kw.pop("tensor"),
                   rel_err=kw.pop("rel_err", math.nan), max_abs=kw.pop("max_abs", math.nan),
                   bitwise_same_as_first=kw.pop("same", True), bad_rows=kw.pop("bad", -1),
                   first_bad=kw.pop("where", ""))
        rows.append(row)
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)

    def where(mask_bht):  # (B,Hq,T) bool -> "h:t" of the first few, and how many distinct t / h
        idx = torch.nonzero(mask_bht[0])
        if idx.numel() == 0:
            return ""
        hs, ts = idx[:, 0], idx[:, 1]
        return (f"n_h={hs.unique().numel()} n_t={ts.unique().numel()} t_min={int(ts.min())} t_max={int(ts.max())} "
                + " ".join(f"{int(h)}:{int(t)}" for h, t in idx[:8].tolist()))

    for fill in (float("nan"), 7.0):
        lse = torch.full((1, Hq, T), fill, device=q.device, dtype=torch.float32)
        _flash_attn_fwd(q, k, v, softmax_scale=scale, causal=True, return_lse=True, lse=lse)
        torch.cuda.synchronize()
        left = lse.isnan() if fill != fill else (lse == fill)
        say(what=f"fa4-lse-prefill-{fill}", tensor="lse", bad=int(left.sum()), where=where(left))
    o1, l1 = _flash_attn_fwd(q, k, v, softmax_scale=scale, causal=True, return_lse=True)[:2]
    o2, l2 = _flash_attn_fwd(q, k, v, softmax_scale=scale, causal=True, return_lse=True)[:2]
    torch.cuda.synchronize()
    diff = l1 != l2
    say(what="fa4-lse-twice", tensor="lse", same=bool(torch.equal(l1, l2)), bad=int(diff.sum()), where=where(diff))
    say(what="fa4-o-twice", tensor="o", same=bool(torch.equal(o1, o2)))
    gen = torch.Generator().manual_seed(3)
    pos = sorted(set([0, 1, T // 2, T - 1] + torch.randint(0, T, (60,), generator=gen).tolist()))
    ref = torch.stack([torch.logsumexp(torch.einsum("jgd,njd->jgn", q[0, t].float().reshape(Hk, G, d),
                                                    k[0, :t + 1].float()) * scale, -1).reshape(-1) for t in pos], 1)
    got = l1[0][:, pos]
    say(what="fa4-lse-vs-fp32", tensor="lse", rel_err=max_rel_err(got, ref), max_abs=float((got - ref).abs().max()))
    od, lsed = depth_fwd(q, kd, vd, scale, G, 16)
    outs = []
    for rep in range(2):
        o, lh, ld = o1.clone(), l1.clone(), lsed.clone()
        torch.cuda.synchronize()
        merged = _merge(o, lh, od, ld)
        torch.cuda.synchronize()
        outs.append(merged)
    say(what="merge-twice", tensor="out", same=bool(torch.equal(outs[0][0], outs[1][0])))
    say(what="merge-twice", tensor="lse", same=bool(torch.equal(outs[0][1], outs[1][1])))
    runs = [moda_fa4(q, k, v, kd, vd, return_lse=True) for _ in range(3)]
    torch.cuda.synchronize()
    for rep, (o, lse_th) in enumerate(runs[1:], 1):
        bad = (o != runs[0][0]).any(-1).permute(0, 2, 1)  # (B,Hq,T)
        say(what="moda-fa4-fwd-vs-first", rep=rep, tensor="out", same=not bool(bad.any()), bad=int(bad.sum()),
            rel_err=max_rel_err(o, runs[0][0]), where=where(bad))
        badl = (lse_th != runs[0][1]).permute(0, 2, 1)
        say(what="moda-fa4-fwd-vs-first", rep=rep, tensor="lse", bad=int(badl.sum()), where=where(badl))
    del x
    torch.cuda.empty_cache()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", default="32768,4099")
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--L", type=int, default=64)
    ap.add_argument("--Hk", type=int, default=8)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--programs", default="4,8,10,132")
    ap.add_argument("--reps", type=int, default=2, help="runs of each program count")
    ap.add_argument("--bad", type=float, default=0.05, help="row relative error counted as bad")
    ap.add_argument("--full", action="store_true", help="also moda_overlap against moda_fa4 (needs FA4)")
    ap.add_argument("--lse", action="store_true", help="only FA4's lse and the merge at full size (FA4)")
    ap.add_argument("--determinism", action="store_true",
                    help="only the run-to-run level: FA4, depth, merge, whole forwards, out around the backward (FA4)")
    ap.add_argument("--device", default="cuda", help="cpu: the depth level under TRITON_INTERPRET=1")
    ap.add_argument("--out", default="overlap_check.csv")
    args = ap.parse_args(argv)
    programs = [int(v) for v in args.programs.split(",")]
    rows: list[dict] = []
    try:
        for T in [int(v) for v in args.T.split(",")]:
            if args.lse:
                level_lse(T, args.G, args.L, rows, args)
                continue
            if args.determinism:
                level_determinism(T, args.G, args.L, rows, args)
                continue
            level_depth(T, args.G, args.L, programs, args.bad, rows, args)
            if args.full:
                level_full(T, args.G, args.L, programs, rows, args)
    finally:
        if rows:
            with open(args.out, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
            print(f"wrote {args.out} ({len(rows)} rows)")
    worst = max((r["rel_err"] for r in rows if r["level"] == "depth"), default=math.nan)
    print(f"worst depth-level relative error {worst:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
