"""torch.compile check of the model of `moda-bench model` (issue 59, item 3), one command on a GPU:

    python3 tools/compile_check.py --out DIR

Per case (configuration, layers, T; default: smoke at T = 512, 4-layer dattn-1.5b and moda-700m at
T = 2048) and variant, in bf16: the graph breaks of `Decoder.loss` (torch._dynamo.explain; every
break's reason, the function dynamo refused and the user frame it was in: `break_details`), the
seconds of the first compiled step (compilation included), and the relative error (norm of the
difference / norm of eager's) of the compiled loss and the largest over the parameter gradients,
against the same model in eager. A variant that breaks or fails still gets its row. Then the
strided-depth check: `moda_attention` on a slice of one depth buffer against the same call on a
contiguous copy (out and the five gradients, max abs difference; the kernels read the slice in
place, so it should be 0).

Writes DIR/compile_check.csv (one row per case and variant; break_reasons: each distinct break
once, with its count) and DIR/compile_check.json (those rows, each with its full list of breaks
under "breaks", plus the strided check, the torch and Triton versions), and prints each row as it
finishes. Off CUDA (--device cpu, under TRITON_INTERPRET=1) it runs the same at whatever small
--cases are given.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from moda_bench.bench.model import RUN_VARIANTS, model_variant
from moda_bench.models.config import get_config
from moda_bench.models.decoder import Decoder

DEFAULT_CASES = ("smoke::512", "dattn-1.5b:4:2048", "moda-700m:4:2048")
FIELDS = ("case", "model", "layers", "T", "variant", "dtype", "backend", "graph_breaks", "graph_count", "break_reasons",
          "compile_s", "loss_rel_err", "grad_max_rel_err", "n_grads", "error")
ROOT = Path(__file__).resolve().parents[1]


def parse_case(text: str):
    """'model[:layers[:T]]' -> the configuration as run (empty fields: the configuration's own)."""
    name, layers, T = (text.split(":") + ["", ""])[:3]
    cfg = get_config(name)
    if layers:
        cfg = cfg.with_layers(int(layers))
    if T:
        cfg = cfg.replace(seq_len=int(T))
    return cfg


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / (b.float().norm() + 1e-30))


def _step(model, fn, tokens):
    model.zero_grad(set_to_none=True)
    loss = fn(tokens)
    loss.backward()
    return loss.detach(), [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def check_variant(cfg, run_variant: str, *, dtype, device, backend: str, batch: int = 1, seed: int = 0) -> dict:
    """One row: graph breaks, compile seconds and the compiled step's errors against eager."""
    variant, depth_grad = model_variant(run_variant)
    row = {"model": cfg.name, "layers": cfg.layers, "T": cfg.seq_len, "variant": run_variant,
           "dtype": str(dtype).replace("torch.", ""), "backend": backend}
    model = None
    try:
        torch.manual_seed(seed)
        model = Decoder(cfg, (variant,), dtype=dtype, device=device)
        tokens = torch.randint(0, cfg.vocab, (batch, cfg.seq_len + 1), device=device)
        model.prepare(variant, batch, cfg.seq_len, depth_grad=depth_grad)

        def fn(t):
            return model.loss(t, variant, depth_grad=depth_grad)

        eager_loss, eager_grads = _step(model, fn, tokens)
        torch._dynamo.reset()
        explained = torch._dynamo.explain(fn)(tokens)
        row["graph_breaks"], row["graph_count"] = explained.graph_break_count, explained.graph_count
        row["breaks"] = break_details(explained)
        row["break_reasons"] = break_summary(row["breaks"])
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend=backend)
        _sync(device)
        t0 = time.perf_counter()
        loss, grads = _step(model, compiled, tokens)
        _sync(device)
        row["compile_s"] = round(time.perf_counter() - t0, 2)
        row["loss_rel_err"] = _rel(loss, eager_loss)
        row["n_grads"] = len(grads)
        if len(grads) != len(eager_grads):
            raise RuntimeError(f"{len(grads)} parameter gradients compiled, {len(eager_grads)} eager")
        row["grad_max_rel_err"] = max(_rel(a, b) for a, b in zip(grads, eager_grads))
    except Exception as exc:  # noqa: BLE001 (a failing variant is a row, not the end of the check)
        row["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"
    finally:
        model = None  # noqa: F841 (the weights go before the next variant)
        torch._dynamo.reset()
        if str(device).startswith("cuda"):
            torch.cuda.empty_cache()
    return row


def _where(frame) -> str:
    path = Path(frame.filename)
    try:
        path = path.resolve().relative_to(ROOT)
    except ValueError:
        pass
    return f"{path}:{frame.lineno} {frame.name}"


def _field(lines: list, tag: str, limit: int) -> str:
    return next((ln[len(tag):].strip()[:limit] for ln in lines if ln.startswith(tag)), "")


def break_details(explained) -> list[dict]:
    """Every graph break of a `torch._dynamo.explain` result, in order: its reason (the headline),
    dynamo's explanation, its debug context (module and qualname of a function it refused), the
    innermost user frame ("file:line function", repository-relative), that frame's source line and
    the user stack (outermost first)."""
    rows = []
    for r in explained.break_reasons:
        lines = [ln.strip() for ln in str(r.reason).splitlines() if ln.strip()]
        stack = list(getattr(r, "user_stack", None) or [])
        rows.append({"reason": lines[0][:200] if lines else "",
                     "explanation": _field(lines, "Explanation:", 400),
                     "context": _field(lines, "Developer debug context:", 300),
                     "frame": _where(stack[-1]) if stack else "",
                     "source": (stack[-1].line or "").strip()[:200] if stack else "",
                     "stack": [_where(f) for f in stack]})
    return rows


def break_summary(breaks: list) -> str:
    """The CSV's break_reasons: each distinct (frame, reason, context) once, "N x frame: reason
    [context]", in order of first appearance, joined by " | ". The counts are of the breaks dynamo
    reports; explain's graph_break_count may be larger (a break inside an inlined call also splits
    each frame above it)."""
    counts = Counter((b["frame"], b["reason"], b["context"]) for b in breaks)
    return " | ".join(f"{n} x {frame}: {reason}" + (f" [{ctx}]" if ctx else "")
                      for (frame, reason, ctx), n in counts.items())


def strided_depth_check(device, dtype, *, B=1, T=1000, Hk=4, G=4, d=64, entries=12, L=7) -> dict:
    """moda_attention on depth K/V slices [:, :, :L] of (B, T, entries, Hk, d) buffers against the
    same call on contiguous copies: max abs difference of out and the five gradients."""
    from moda_bench.kernels.moda import moda_attention
    g = torch.Generator(device="cpu").manual_seed(1)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    q, k, v = rand(B, T, Hk * G, d), rand(B, T, Hk, d), rand(B, T, Hk, d)
    bk, bv = rand(B, T, entries, Hk, d), rand(B, T, entries, Hk, d)
    results = {}
    for name, (kd, vd) in {"slice": (bk[:, :, :L], bv[:, :, :L]),
                           "contiguous": (bk[:, :, :L].contiguous(), bv[:, :, :L].contiguous())}.items():
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        kd, vd = kd.detach().requires_grad_(True), vd.detach().requires_grad_(True)   # views stay views
        out = moda_attention(*leaves, kd, vd)
        out.float().square().sum().backward()
        results[name] = [out.detach()] + [t.grad for t in (*leaves, kd, vd)]
    diff = max(float((a.float() - b.float()).abs().max()) for a, b in zip(results["slice"], results["contiguous"]))
    return {"shape": {"B": B, "T": T, "Hk": Hk, "G": G, "d": d, "entries": entries, "L": L}, "max_abs_diff": diff}


def _triton_version() -> str:
    try:
        import triton
    except ImportError:
        return ""
    return triton.__version__


def _sync(device) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for compile_check.csv and .json")
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES), help="comma-separated model[:layers[:T]]")
    ap.add_argument("--variants", default=",".join(RUN_VARIANTS), help="comma-separated run variants")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-strided", action="store_true", help="skip the strided-depth check")
    args = ap.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    if bad := [v for v in variants if v not in RUN_VARIANTS]:
        ap.error(f"unknown variant {bad[0]!r}; known: {', '.join(RUN_VARIANTS)}")
    try:
        cases = [(text, parse_case(text)) for text in args.cases.split(",") if text]
    except ValueError as exc:
        ap.error(str(exc))
    dtype = getattr(torch, args.dtype)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with open(args.out / "compile_check.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS)
        writer.writeheader()
        for text, cfg in cases:
            for variant in variants:
                row = {"case": text, **check_variant(cfg, variant, dtype=dtype, device=args.device,
                                                     backend=args.backend)}
                rows.append(row)
                writer.writerow({f: row.get(f, "") for f in FIELDS})
                fh.flush()
                print(json.dumps({k: v for k, v in row.items() if k != "breaks"}), flush=True)   # full list: .json
    report = {"rows": rows, "torch": torch.__version__, "triton": _triton_version(), "device": args.device,
              "gpu": torch.cuda.get_device_name() if str(args.device).startswith("cuda") else ""}
    if not args.no_strided:
        report["strided_depth"] = strided_depth_check(args.device, dtype)
        print("strided depth slice vs contiguous:", json.dumps(report["strided_depth"]), flush=True)
    (args.out / "compile_check.json").write_text(json.dumps(report, indent=1))
    return 0 if all(not r.get("error") and r.get("graph_breaks") == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
