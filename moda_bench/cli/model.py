"""`moda-bench model`: options and messages; the work is `moda_bench.bench.model.run_model`.

Builds one `ModelSpec` (or a preset's list of them), runs each, and writes
`<out>/model_<label>.csv` (schema.MODEL_COLUMNS, rows appended as variants finish) and, with
`--profile`, `<out>/profile_<label>.csv` (where a step's time goes, per variant); prints a
summary table per run. User mistakes are one line (typer.BadParameter), no traceback.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Optional

import typer

from moda_bench.bench.point import TimingOptions
from moda_bench.bench.runner import QUICK_REP_MS, QUICK_WARMUP_MS
from moda_bench.cli import checks


def _fmt(v, spec: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def summary_table(frame, title: str):
    """rich Table of one run: a row per variant."""
    from rich.table import Table
    table = Table(title=title)
    for col in ("variant", "depth", "status", "step ms", "x vanilla [95% CI]", "tokens/s", "peak GB", "TFLOP/s",
                "MFU", "params M"):
        table.add_column(col, justify="left" if col in ("variant", "depth", "status") else "right", no_wrap=True)
    table.add_column("note", overflow="fold")
    for r in frame.to_dict("records"):
        ratio = _fmt(r["ratio_to_vanilla"], ".3f")
        if not math.isnan(r.get("ratio_to_vanilla_lo") or math.nan):
            ratio += f" [{r['ratio_to_vanilla_lo']:.3f}-{r['ratio_to_vanilla_hi']:.3f}]"
        ms = r["step_ms"]
        tflops = r["model_flops"] / ms / 1e9 if ms and ms == ms and ms > 0 else math.nan
        depth = ("attached" if r["depth_grad"] else "detached") if r["provider"] == "moda" else "-"
        table.add_row(r["provider"], depth, str(r["status"]), _fmt(ms, ".2f"),
                      ratio, _fmt(r["tokens_per_s"], ".0f"), _fmt(r["peak_mem_gb"], ".2f"), _fmt(tflops, ".1f"),
                      _fmt(r["mfu"], ".3f"), _fmt(r["params"] / 1e6, ".1f"), _note(r))
    return table


def _note(r: dict) -> str:
    """The row's reason, after its graph-break count where it was compiled."""
    reason = r["reason"] if isinstance(r["reason"], str) else ""
    breaks = r.get("graph_breaks", math.nan)
    if breaks != breaks:   # NaN: not compiled
        return reason
    return f"{int(breaks)} graph breaks" + (f"; {reason}" if reason else "")


def _title(spec) -> str:
    cfg = spec.config()
    return (f"{spec.label}: {cfg.name}, {cfg.layers}/{cfg.layers_total} layers, B={spec.batch}, T={cfg.seq_len}"
            + (f", grad_accum={spec.grad_accum}" if spec.mode == "train" else "")
            + (f", {spec.new_tokens} new tokens" if spec.mode == "generate" else "")
            + (", compiled" if spec.compile else ", eager"))


def model_command(
    model: Annotated[str, typer.Option("--model", help="Configuration: smoke, dattn-1.5b, dattn-3b, moda-700m, "
                                                       "moda-1.5b.")] = "smoke",
    variants: Annotated[Optional[str], typer.Option(
        "--variants", help="Comma-separated: vanilla, moda, moda-detached, depth-attention, depth-attention-torch, "
                           "denseformer, attnres, mhc (default: all but moda-detached).", show_default=False)] = None,
    mode: Annotated[str, typer.Option("--mode", help="train (fwd + bwd + AdamW), prefill or generate.")] = "train",
    layers: Annotated[Optional[int], typer.Option("--layers", help="Run this many of the model's layers "
                                                  "(default: all).", show_default=False)] = None,
    batch: Annotated[int, typer.Option("--batch", help="Sequences per micro-batch.")] = 1,
    grad_accum: Annotated[int, typer.Option("--grad-accum", help="Micro-batches per training step.")] = 1,
    seq_len: Annotated[Optional[int], typer.Option("--seq-len", help="Tokens per sequence (prompt length for "
                                                   "generate; default: the model's).", show_default=False)] = None,
    new_tokens: Annotated[int, typer.Option("--new-tokens", help="Tokens generated per sequence (generate).")] = 32,
    dtype: Annotated[Optional[str], typer.Option("--dtype", help="bf16, fp16 or fp32 (default: the model's).",
                                                 show_default=False)] = None,
    detached: Annotated[bool, typer.Option("--detached", help="Run MoDA with detached depth K/V.")] = False,
    compile_: Annotated[bool, typer.Option("--compile", help="torch.compile the forward (and its backward).")] = False,
    moda_impl: Annotated[Optional[str], typer.Option(
        "--moda-impl", help="MoDA implementation of eager MoDA layers: auto (the dispatcher's choice per layer "
                            "shape, `moda-bench dispatch`), triton, fa4, overlap or fused (one that cannot run "
                            "falls back to triton; compiled steps run triton). Default: auto, or the preset's.",
        show_default=False)] = None,
    preset: Annotated[Optional[str], typer.Option("--preset", help="A named set of runs, sweeps/model/NAME.toml "
                                                  "(smoke, seed002-train, seed000-moda, seed002-generate), or "
                                                  "the path of your own .toml.", show_default=False)] = None,
    out: Annotated[Path, typer.Option("--out", help="Output folder.")] = Path("results/model"),
    quick: Annotated[bool, typer.Option("--quick", help="Shorter warm-up and sampling.")] = False,
    max_time_s: Annotated[float, typer.Option("--max-time-s", help="Cap of one run's interleaved timing (s).")]
        = 60.0,
    profile: Annotated[bool, typer.Option("--profile", help="Also record where one step's time goes "
                                          "(torch.profiler).")] = False,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the weights and tokens.")] = 0,
    resume: Annotated[bool, typer.Option("--resume", help="Continue an interrupted run into the same --out: runs "
                                         "whose CSV holds every variant (same GPU and commit) are kept, the "
                                         "others run again.")] = False,
    allow_commit_change: Annotated[bool, typer.Option("--allow-commit-change", help="With --resume: keep runs "
                                                      "measured at another commit.")] = False,
    depth_read: Annotated[Optional[str], typer.Option(
        "--depth-read", help="MoDA layers read their depth slice of the model's buffer in place (in-place) or "
                             "copy it first (copy): an A/B of the copy's cost against the strided kernels'. "
                             "Default: in-place, or the preset's.", show_default=False)] = None,
    depth_grad_add: Annotated[Optional[str], typer.Option(
        "--depth-grad-add", help="Attached MoDA's depth gradients added into the buffer's gradient in the "
                                 "backward kernel (kernel), after it (after), or as the kernel decides (auto). "
                                 "Default: auto, or the preset's.", show_default=False)] = None,
    strict: checks.StrictOption = False,
    health_check: checks.CheckOption = True,
) -> None:
    """Time a whole decoder's training step, prefill or generation for each variant."""
    from rich.console import Console

    from moda_bench.bench import model as bm
    if not max_time_s > 0:
        raise typer.BadParameter(f"--max-time-s must be > 0, got {max_time_s}")
    timing = TimingOptions(warmup_ms=QUICK_WARMUP_MS, min_time_ms=QUICK_REP_MS, min_samples=5, max_time_s=max_time_s) \
        if quick else TimingOptions(max_time_s=max_time_s)
    names = None
    if variants is not None:
        names = tuple(v.strip() for v in variants.split(",") if v.strip())
    try:
        if preset is not None:
            specs = bm.preset_specs(preset, variants=names, layers=layers, dtype=dtype, compile=compile_ or None,
                                    timing=timing, seed=seed, moda_impl=moda_impl, depth_read=depth_read,
                                    depth_grad_add=depth_grad_add)
        else:
            names = names or tuple(v for v in bm.RUN_VARIANTS if v != bm.DETACHED)
            specs = (bm.ModelSpec(model, names, mode=mode, layers=layers or 0, batch=batch, grad_accum=grad_accum,
                                  seq_len=seq_len or 0, new_tokens=new_tokens, dtype=dtype or "", compile=compile_,
                                  timing=timing, seed=seed, moda_impl=moda_impl or "auto",
                                  depth_read=depth_read or "in-place", depth_grad_add=depth_grad_add or "auto"),)
        if detached:
            specs = tuple(s.replace(variants=tuple(bm.DETACHED if v == "moda" else v for v in s.variants))
                          for s in specs)
        for s in specs:
            s.config()
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    import sys
    console = Console(width=None if sys.stdout.isatty() else 200)   # logs keep every column
    import torch

    from moda_bench import schema
    from moda_bench.bench import runstate
    from moda_bench.cli.lifecycle import command_line, resume_command, take_lock
    lock = take_lock(out, None, console)
    meta = schema.run_metadata() if resume else {}
    gpu_run = checks.RunHealth(checks.device_indices(None), enabled=health_check and torch.cuda.is_available())
    gpu_run.check("start", console)   # each row's `health` is the start verdict; finish() re-marks on a bad end
    specs = tuple(s.replace(health=gpu_run.row_label()) for s in specs)
    bm.record_run(out, command_line(), specs, gpu_header=gpu_run.header())
    csvs = []
    try:
        with runstate.interrupts():
            for spec in specs:
                csv = out / f"model_{spec.label}.csv"
                if resume:
                    try:
                        state = bm.resume_state(spec, csv, gpu=meta["gpu"], commit=meta["git_commit"],
                                                allow_commit_change=allow_commit_change)
                    except runstate.ResumeRefused as exc:
                        console.print(f"[red]error:[/] {exc}", highlight=False)
                        raise typer.Exit(2)
                    if state == "done":
                        console.print(f"[dim]{spec.label}: done in the run being resumed ({csv})[/]")
                        continue
                hook = None
                if profile:
                    from moda_bench.bench.model_profile import profile_hook
                    hook = profile_hook(spec, out / f"profile_{spec.label}.csv")
                csvs.append(csv)
                frame = bm.run_model(spec, csv, console=console, on_model=hook)
                console.print(summary_table(frame, _title(spec)))
    except runstate.Interrupted as exc:
        console.print(f"interrupted ({exc}): finished runs kept in {out}; resume with: "
                      f"{resume_command(out, '--out' in sys.argv)}", markup=False, highlight=False)
        raise typer.Exit(runstate.exit_code_of(exc))
    finally:
        lock.release()
    console.print(f"wrote {out}/model_*.csv")
    checks.finish(gpu_run, console, csvs, strict)
