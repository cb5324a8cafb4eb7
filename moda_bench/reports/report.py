"""`moda-bench report`'s work: REPORT.md and figures/*.png regenerated from saved CSVs (no GPU,
no torch, no triton). The command itself (options, messages, exit codes) is `moda_bench.cli.report`;
the reports/ tree of one report per GPU folder is `reports.tree`.

Inputs (`reports.inputs`): the results CSVs found recursively under the given directories, read
through `moda_bench.results`, and the paper's A100 reference tables. Tables are built by
`reports.tables` (training, ablation, timers, GPU state) and `reports.workloads` (decode,
Depth-Attention), written by `reports.markdown` and drawn by `reports.figures` and
`reports.workload_figures`; the `moda-bench model` files, where there are any, by
`reports.models` (MODELS.md beside REPORT.md). Outputs are byte-identical for identical inputs.

Row selection: rows are de-duplicated on `schema.ROW_KEY` (sweep, GPU, provider, pass, timer,
config); when several runs measured the same key the newest `timestamp` wins (ties: later file,
then later line) and the report lists what was superseded.

GPUs: the rows of each GPU are kept apart. Where the report holds several GPUs, every table is
drawn per GPU (its heading ends 'on <GPU>', the GPUs' tables of one sweep next to each other)
and every figure per GPU (`<figure>-<gpu slug>.png`); with one GPU names are as they always were.

Figures: `figures/manifest.json` records the digest of each figure's inputs (`reports.manifest`);
a figure is drawn again only when its digest changed or its file is missing, and figures the
manifest lists that have no data any more are removed.

Optional data (columns the CSVs gained later) adds blocks and columns only where some row has
it: paired ratio intervals, ratios to the fastest attention, samples, noise and the distance to
the floor in the efficiency tables; an eager-vs-graph table where both timers measured a point;
a GPU-state block (clocks, power, throttle reasons, health, unhealthy runs flagged) per results
folder; decode and Depth-Attention blocks where those sweeps were run. Configuration columns
added later (depth_grad, Tq, S) are named only off their default.

The names other commands use (`load_results`, `load_paper`, `ablation_sections`, `ReportError`)
are importable from here as well as from the modules that own them.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from moda_bench.reports.inputs import Paper, Results, Warn, load_paper, load_results, match_columns
from moda_bench.reports.markdown import (
    ablation_markdown,
    dattn_markdown,
    decode_markdown,
    efficiency_markdown,
    gpu_state_markdown,
    own_clock_markdown,
    provenance_markdown,
    repeat_markdown,
    timer_markdown,
    unhealthy_rows,
)
from moda_bench.reports.tables import (
    DATTN,
    DECODE,
    TRAIN,
    Section,
    ablation_sections,
    efficiency_sections,
    gpu_states,
    gpus_of,
    matmul_ceiling,
    of_gpu,
    own_clocks,
    pick_provider,
    rows_of,
    timer_sections,
)
from moda_bench.reports.tuning import tuning_markdown
from moda_bench.reports.vocab import (
    FA2_PROVIDERS,
    MISSING,
    MIX_PROVIDER,
    MODA_PROVIDERS,
    RATIO_BASELINE,
    SEQUENCE_ONLY,
    TIMER_LABEL,
    ReportError,
    gpu_slug,
    sort_timers,
)
from moda_bench.reports.workloads import dattn_sections, decode_sections
from moda_bench.results import default_warn, read_tuning

__all__ = ["generate_report", "ReportError", "Results", "Paper", "load_results", "load_paper",
           "ablation_sections", "Written"]


class Written(list):
    """The paths `generate_report` leaves in its output (sorted), plus `drawn`: the figures this
    call drew (the others were up to date)."""

    drawn: list[Path]


def figure_suffixes(gpus: list[str]) -> dict[str, str]:
    """File-name suffix per GPU: '' for a report of one GPU, else '-<gpu slug>' (made unique)."""
    if len(gpus) <= 1:
        return {g: "" for g in gpus}
    out: dict[str, str] = {}
    for g in gpus:
        slug, n = gpu_slug(g), 2
        while f"-{slug}" in out.values():
            slug, n = f"{gpu_slug(g)}-{n}", n + 1
        out[g] = f"-{slug}"
    return out


def generate_report(results_dirs: list[Path], out_dir: Path, *, paper_dir: Path | None = None,
                    ceiling_tflops: float | None = None, fa2_provider: str | None = None,
                    moda_provider: str | None = None, figures: bool = True, draw: bool = True,
                    warn: Optional[Warn] = None) -> Written:
    """Write out_dir/REPORT.md and out_dir/figures/*.png (+ manifest.json) from the CSVs under results_dirs.

    Deterministic: the same inputs give byte-identical files. Returns the report, its figures and
    the manifest, sorted (`Written.drawn`: the figures drawn by this call). `draw=False` writes
    REPORT.md alone, its figure links as a drawing call would make them (nothing under figures/).
    Raises ReportError for missing/empty inputs or malformed CSVs; CSVs that are not results
    files and malformed rows are skipped, each with one line to `warn` (default: warnings.warn).
    """
    results_dirs = [Path(d) for d in results_dirs]
    out_dir = Path(out_dir)
    from moda_bench.reports.models import write_models_report
    models = write_models_report(results_dirs, out_dir, figures=figures, warn=warn) if all(
        d.exists() for d in results_dirs) else []
    try:
        results = load_results(results_dirs, warn=warn)
    except ReportError:
        if models:   # only `moda-bench model` files: MODELS.md is the report
            return sorted(models)
        raise
    paper = load_paper(paper_dir, results_dirs)
    rows = results.rows
    measured = set(rows_of(rows, TRAIN, DATTN, DECODE)["provider"])
    fa2 = pick_provider(measured, fa2_provider, FA2_PROVIDERS, "FA2")
    trained = set(rows_of(rows, TRAIN, DATTN)["provider"])   # decode's `moda` is not the training entry point
    moda = pick_provider(measured if moda_provider else trained, moda_provider, MODA_PROVIDERS, "MoDA")
    eff = efficiency_sections(rows, paper, fa2, moda)
    abl = ablation_sections(rows, paper)
    dec = decode_sections(rows)
    dattn = dattn_sections(rows)
    gpus = gpus_of(rows)
    ceilings = {g: matmul_ceiling(of_gpu(rows, g), ceiling_tflops) for g in gpus}

    out_dir.mkdir(parents=True, exist_ok=True)
    written, drawn = Written(), []
    fig_links: dict[str, str] = {}
    if figures:
        from moda_bench.reports import figures as figs
        from moda_bench.reports import manifest
        fig_dir = out_dir / "figures"
        known = manifest.load(fig_dir)
        files = []
        for gpu, suffix in figure_suffixes(gpus).items():
            files += figs.write_all(fig_dir, rows=of_gpu(rows, gpu), eff_sections=[s for s in eff if s.gpu == gpu],
                                    abl_sections=[s for s in abl if s.gpu == gpu], paper=paper,
                                    ceiling=ceilings[gpu], suffix=suffix, gpu=gpu if len(gpus) > 1 else "",
                                    known=known, draw=draw)
        fig_links = {f.path.stem: os.path.relpath(f.path, out_dir).replace(os.sep, "/") for f in files}
        if draw:
            entries = {f.path.name: f.digest for f in files}
            for extra in models:   # the model report's profile figures (deterministic bytes) share the manifest
                if extra.suffix == ".png" and extra.parent == fig_dir:
                    entries[extra.name] = manifest.digest(extra.name, extra.read_bytes())
            for stale in sorted(set(known) - set(entries)):
                if Path(stale).name == stale and stale.endswith(".png"):   # only figures the manifest listed
                    (fig_dir / stale).unlink(missing_ok=True)
            written += [f.path for f in files] + [manifest.save(fig_dir, entries)]
            drawn = sorted(f.path for f in files if f.drawn)

    states = gpu_states(rows)
    timers = timer_sections(rows)
    md = [f"# MoDA benchmark report\n\nGenerated by `moda-bench report` from {len(results.files)} CSV file(s): "
          f"{len(results.rows)} measurement row(s) shown, {len(results.superseded)} superseded. "
          + (f"Paper reference: A100 tables from `{paper.source}`." if paper.source else
             "Paper reference data not found (pass `--paper-dir`); paper columns are omitted.")
          + (f" GPUs: {', '.join(g or 'unnamed' for g in gpus)}; each GPU's rows are kept apart: every table "
             "heading ends with its GPU (one sweep's tables next to each other) and every figure is drawn per "
             "GPU (`<figure>-<gpu>.png`)." if len(gpus) > 1 else "")]
    n_bad = unhealthy_rows(states)
    if n_bad:
        md.append(f"**WARNING: {n_bad} row(s) shown were measured while the GPU health check said something "
                  "other than healthy; see [GPU state](#gpu-state).**")
    if states:
        md.append(gpu_state_markdown(states))
    own = own_clock_markdown(own_clocks(rows))
    if own:
        md.append(own)
    rep = repeat_markdown(results.rows)
    if rep:
        md.append(rep)
    if eff:
        md.append(f"## Efficiency\n\nFA2 = `{fa2 or MISSING}`, MoDA = `{moda or MISSING}`. Overhead % = "
                  "(MoDA - FA2) / FA2 and extra time % = (MoDA - FA2) / MoDA (the paper's definition), from the "
                  "medians of the same table line; `<provider>/FA2` is that "
                  "provider's ms over FA2's (< 1 is faster). Depth util. is the MoDA row's reported "
                  "depth utilisation. Paper columns are the A100 bf16 numbers, matched on "
                  + ", ".join(match_columns(paper.efficiency)[:-1] if paper.efficiency is not None else ["-"])
                  + " and pass. A failed measurement shows its status."
                  + efficiency_notes(eff, rows_of(rows, TRAIN), moda))
        md += [efficiency_markdown(s, fa2, moda) for s in eff]
    from moda_bench.reports.card import card_blocks
    md += card_blocks(results, paper, moda)
    if timers:
        md.append("## Eager vs graph timer\n\nPoints measured with both timers: eager = host-inclusive (every "
                  "launch issued from Python each repetition), graph = CUDA-graph replays (device time). "
                  "Host share = 1 - graph / eager: the part of the eager time that is launch and host "
                  "overhead rather than GPU work.")
        md += [timer_markdown(s) for s in timers]
    tuning = tuning_markdown(read_tuning(results_dirs, warn=warn or default_warn))
    if tuning:
        md.append(tuning)
    if dec:
        md.append(DECODE_INTRO)
        md += [decode_markdown(s) for s in dec]
    if dattn:
        md.append(DATTN_INTRO)
        md += [dattn_markdown(s) for s in dattn]
    if abl:
        md.append("## Kernel ablation\n\nSpeedup vs previous = previous rung's ms / this rung's ms. "
                  "Paper: A100, bf16, fwd+bwd.")
        md += [ablation_markdown(s) for s in abl]
    md.append(ceiling_markdown(ceilings))
    if fig_links:
        md.append("## Figures\n\n" + "\n\n".join(f"![{stem}]({link})" for stem, link in sorted(fig_links.items())))
    if models:
        md.append("## Whole-model steps\n\nThe `moda-bench model` runs (training step, generation, depth-KV memory, "
                  "where the step's time goes) are in [MODELS.md](MODELS.md).")
    md.append(provenance_markdown(results))
    md.append("Input files: " + ", ".join(f"`{f}`" for f in results.files) + ".")
    report = out_dir / "REPORT.md"
    report.write_text("\n\n".join(md) + "\n", encoding="utf-8", newline="\n")
    written.append(report)
    written.extend(models)
    written.sort()
    written.drawn = drawn
    return written


DECODE_INTRO = (
    "## Decode\n\nOne inference step of the Tq newest tokens of B sequences over a KV cache of T tokens "
    "(MoDA: each new token also reads its L depth entries; fa2, cudnn, fa4 and flashinfer: sequence only). "
    "Per provider: the median µs of each timer (graph = CUDA-graph replays, device time; eager = "
    "host-inclusive), then from the graph timer's rows the bytes per second reached (GB/s = minimum HBM "
    "bytes / median), `% of copy` = 1 / of_floor, the share of the run's device copy rate reached "
    "(decode is memory-bound: its floor is its bytes at the copy rate), and `/fastest` the paired "
    "ratio to the fastest sequence-only decode of the point (named in `fastest`) with its 95% interval.")
DATTN_INTRO = (
    "## Depth-Attention\n\nS earlier source layers mixed into each token's values, then causal attention "
    "(dattn: fused Triton mix + attention; dattn-torch: the mix in plain PyTorch), against MoDA reading "
    "L = S depth entries. `<method>/fastest` is the method's time over the fastest sequence-only "
    f"attention of the point (`fastest`, its ms beside it; {', '.join(SEQUENCE_ONLY)}), with the paired "
    f"95% interval: the overhead of the depth part over vanilla attention. `{MIX_PROVIDER}` is the mix "
    "kernel alone: its GB/s and `% of copy` = 1 / of_floor, the share of the copy rate reached (the mix is "
    "memory-bound).")


def ceiling_markdown(ceilings: dict) -> str:
    """The Ceiling block: the matmul ceiling the TFLOP/s figure is drawn against (per GPU where several)."""
    if len(ceilings) == 1:
        (tflops, source), = ceilings.values()
        return (f"## Ceiling\n\nAchieved TFLOP/s are drawn against a matmul ceiling of {tflops:.1f} TFLOP/s "
                f"({source}).")
    return ("## Ceiling\n\nAchieved TFLOP/s are drawn against a matmul ceiling per GPU: " + "; ".join(
        f"{gpu or 'unnamed GPU'}: {tflops:.1f} TFLOP/s ({source})" for gpu, (tflops, source) in ceilings.items()) + ".")


def efficiency_notes(sections: list[Section], rows, moda: str | None) -> str:
    """Sentences explaining the optional efficiency columns and timers that the sections show."""
    notes = []
    if any(s.has_ci for s in sections):
        notes.append(f" MoDA/FA2 [95% CI] is the paired ratio to `{RATIO_BASELINE}` from interleaved rounds "
                     "(geometric mean of the per-round ratios) with its 95% confidence interval; `<provider>/FA2` "
                     "cells with an interval are paired the same way. The extra-time figure draws these "
                     "ratios, their intervals as error bars.")
    best = sorted({p for s in sections for p in s.best_providers} - {moda})
    if any(s.best_providers for s in sections):
        notes.append(" `MoDA/fastest`" + "".join(f" (`{p}/fastest`)" for p in best) + " is the time over the "
                     f"fastest sequence-only attention measured on this GPU at that point by any run read here "
                     f"({', '.join(SEQUENCE_ONLY)}; named in brackets, † where it was timed in another run than "
                     "the row's): the distance to the best attention this GPU offers, which has no depth part.")
    if any(s.floor_providers for s in sections):
        notes.append(" `MoDA floor ms` is the time no implementation of MoDA's work can beat on this GPU: "
                     "max(useful FLOPs / matmul rate, minimum HBM bytes / copy rate) at the run's canary rates "
                     "(`floor_ms`); `<provider> x floor` is that provider's median over its own floor (`of_floor`; "
                     "1.00x is the floor). The floor figure draws them.")
    if any(s.has_samples or s.has_noise for s in sections):
        notes.append(" Samples: the fewest timed repetitions of any provider of the line; noise %: the largest "
                     "(p80 - p20) / median of any provider of the line.")
    if any(s.timer for s in sections):
        notes.append(" Each timer has its own tables: " + "; ".join(
            TIMER_LABEL.get(t, f"{t} timer") for t in sort_timers(rows["timer"])) + ".")
    return "".join(notes)
