"""The whole-model part of `moda-bench report`: MODELS.md and figures/model_profile*.png|svg from
the `moda-bench model` CSVs (`results.read_models`, `results.read_profiles`).

Per GPU: the training step-cost table beside seed 002's Table 3 (its plain-PyTorch seconds per
step and overhead over vanilla) and seed 000's FLOP counts; the generation table beside seed
002's run; the depth-KV memory table (each depth variant's peak over vanilla's against seed 004's
formula and against what the run held for depth, and seed 001's 128K example); the depth K/V
traffic a training step moves at least, against what the variant measured; the profile
figure (each variant's step split into attention, depth-KV handling, projections, FFN, residual
mixing, LM head, optimizer, other).
A run of fewer layers than its configuration says so, with the step scaled by layers_total /
layers (the per-layer cost; the embedding and head are counted with it, so it overestimates).
"""
from __future__ import annotations

import math
from pathlib import Path

from moda_bench.floor import DTYPE_BYTES
from moda_bench.reports.markdown import md_table

# seed 002 Table 3: seconds per training step (plain PyTorch, FP16, T=2048)
SEED002_STEP_S = {
    "dattn-1.5b": {"vanilla": 3.28, "depth-attention": 3.58, "denseformer": 4.95, "attnres": 4.85, "mhc": 13.83},
    "dattn-3b": {"vanilla": 4.63, "depth-attention": 5.15, "denseformer": 6.84, "attnres": 8.10, "mhc": 18.85},
}
# seed 000: parameters (M) and FLOPs (T) of its 700M model, vanilla and MoDA (depth KV + FFN KV projection)
SEED000_700M = {"vanilla": (669.0, 8.01), "moda": (705.7, 8.33)}
# seed 002's generation run: 3B, batch 64, 2048 prompt + 2048 generated tokens, seconds
SEED002_GENERATE_S = {"vanilla": 526.6, "depth-attention": 532.8}
# seed 001's worked example: T=128000, L=32 layers, 8 KV heads, d=128, 2 bytes -> 16.8 GB of depth K/V
SEED001_EXAMPLE = (128000, 32, 8, 128, 2)
ORDER = ("vanilla", "moda", "depth-attention", "depth-attention-torch", "denseformer", "attnres", "mhc")


def _f(v, spec: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def _variant(r) -> str:
    name = str(r["provider"])
    return name + (" (detached)" if name == "moda" and r["depth_grad"] == 0 else "")


def _sort(frame):
    rank = {p: i for i, p in enumerate(ORDER)}
    return frame.assign(_r=frame["provider"].map(lambda p: rank.get(p, 99)), _d=-frame["depth_grad"]) \
        .sort_values(["_r", "_d"], kind="stable").drop(columns=["_r", "_d"])


def _ratio(r) -> str:
    text = _f(r["ratio_to_vanilla"], ".3f")
    if not math.isnan(r.get("ratio_to_vanilla_lo", math.nan)):
        text += f" [{r['ratio_to_vanilla_lo']:.3f}-{r['ratio_to_vanilla_hi']:.3f}]"
    return text


def _groups(frame, mode: str):
    part = frame[frame["pass"] == mode]
    keys = ["gpu", "model", "layers", "layers_total", "B", "T", "grad_accum", "new_tokens", "dtype", "compiled"]
    keys += ["sweep"] if "sweep" in part else []   # runs of one configuration apart (`--moda-impl` A/Bs)
    for key, g in part.groupby(keys, sort=True, dropna=False):
        yield dict(zip(keys, key)), _sort(g)


def _heading(k: dict, what: str) -> str:
    layers = f"{int(k['layers'])} of {int(k['layers_total'])} layers" if k["layers"] != k["layers_total"] \
        else f"{int(k['layers'])} layers"
    extra = f", grad_accum {int(k['grad_accum'])}" if k["grad_accum"] > 1 else ""
    extra += f", {int(k['new_tokens'])} new tokens" if k["new_tokens"] else ""
    return (f"### {what}: {k['model']}, {layers}, B={int(k['B'])}, T={int(k['T'])}{extra}, {k['dtype']}, "
            f"{'compiled' if k['compiled'] else 'eager'} on {k['gpu']}" + _run_name(k))


def _run(k: dict) -> str:
    """The run a group's rows came from (their sweep "model-<run>"), "" when unnamed."""
    sweep = k.get("sweep")
    return sweep.removeprefix("model-") if isinstance(sweep, str) else ""


def _run_name(k: dict) -> str:
    return f" (run {_run(k)})" if _run(k) else ""


def sequence_line(g) -> str:
    """The sentence naming the sequence attention the table's variants ran ("sequence: X" in impl_detail)."""
    names = sorted({str(d).split(";")[0].split(":", 1)[1].strip() for d in g["impl_detail"]
                    if str(d).startswith("sequence:")})
    if not names:
        return "Sequence attention: not recorded."
    return ("Sequence attention of every variant: " if len(names) == 1 else "Sequence attention (differs by row): ") \
        + ", ".join(f"`{n}`" for n in names) + "."


def moda_lines(g) -> list[str]:
    """The sentence naming what each MoDA row's attention ran (impl_detail after its "sequence: X; ",
    e.g. "moda: auto -> fused for L=2..46 (...), depth attached"); none without MoDA rows."""
    ran = [f"{_variant(r)}: `{str(r['impl_detail']).split('; ', 1)[1]}`" for r in g.to_dict("records")
           if r["provider"] == "moda" and "; " in str(r["impl_detail"])]
    return ["MoDA attention, " + "; ".join(ran) + "."] if ran else []


def train_markdown(frame) -> list[str]:
    out = []
    for k, g in _groups(frame, "train"):
        seed = SEED002_STEP_S.get(k["model"], {})
        scale = k["layers_total"] / k["layers"]
        headers = ["variant", "status", "step ms", "x vanilla [95% CI]", "seed 002 s/step (x vanilla)",
                   "tokens/s", "peak GB", "model TFLOP", "MFU", "params M"]
        if scale != 1:
            headers.insert(3, f"whole-model est. ms (x{scale:.2f})")
        rows = []
        for r in g.to_dict("records"):
            ref = seed.get(r["provider"]) if r["depth_grad"] or r["provider"] != "moda" else None
            ref_text = f"{ref:.2f} ({ref / seed['vanilla']:.3f})" if ref and seed.get("vanilla") else "-"
            cells = [_variant(r), str(r["status"]), _f(r["step_ms"], ".1f"), _ratio(r), ref_text,
                     _f(r["tokens_per_s"], ".0f"), _f(r["peak_mem_gb"], ".2f"), _f(r["model_flops"] / 1e12, ".2f"),
                     _f(r["mfu"], ".3f"), _f(r["params"] / 1e6, ".1f")]
            if scale != 1:
                cells.insert(3, _f(r["step_ms"] * scale, ".0f"))
            rows.append(cells)
        out += [_heading(k, "Training step"), sequence_line(g), *moda_lines(g), md_table(headers, rows)]
        flops = {r["provider"]: r for r in g.to_dict("records") if r["provider"] in ("vanilla", "moda")}
        if "vanilla" in flops and "moda" in flops:
            ours = flops["moda"]["model_flops"] / flops["vanilla"]["model_flops"] - 1
            ref = SEED000_700M["moda"][1] / SEED000_700M["vanilla"][1] - 1
            out.append(f"MoDA's model FLOPs over vanilla here: +{100 * ours:.2f}% (seed 000's 700M: "
                       f"{SEED000_700M['vanilla'][1]}T -> {SEED000_700M['moda'][1]}T, +{100 * ref:.1f}%; parameters "
                       f"{SEED000_700M['vanilla'][0]}M -> {SEED000_700M['moda'][0]}M; here "
                       f"{flops['vanilla']['params'] / 1e6:.1f}M -> {flops['moda']['params'] / 1e6:.1f}M).")
    return out


def generate_markdown(frame) -> list[str]:
    out = []
    for k, g in _groups(frame, "generate"):
        headers = ["variant", "status", "total s", "x vanilla [95% CI]", "seed 002 s (x vanilla)", "new tokens/s",
                   "peak GB"]
        rows = []
        for r in g.to_dict("records"):
            ref = SEED002_GENERATE_S.get(r["provider"])
            rows.append([_variant(r), str(r["status"]), _f(r["step_ms"] / 1e3, ".2f"), _ratio(r),
                         f"{ref:.1f} ({ref / SEED002_GENERATE_S['vanilla']:.4f})" if ref else "-",
                         _f(r["tokens_per_s"], ".0f"), _f(r["peak_mem_gb"], ".2f")])
        out += [_heading(k, "Generation"), *moda_lines(g), md_table(headers, rows)]
    return out


def memory_row(r: dict, vanilla: dict) -> dict:
    """A depth variant's memory over vanilla's in GB: seed 004's formula, what the run held for
    depth (its buffer, the gradient buffer when attached, its extra parameters' gradients and two
    AdamW moments), their sum ('accounted') and the measured peak over vanilla's."""
    measured = r.get("peak_over_vanilla_gb", math.nan)
    if measured != measured:   # a file written before that column: the two peaks
        measured = r["peak_mem_gb"] - vanilla["peak_mem_gb"]
    buffer = r.get("depth_buffer_gb", math.nan)
    grad = r.get("depth_grad_buffer_gb", math.nan)
    # detached MoDA's FFN K/V projection feeds only the detached buffer: no gradient, no AdamW step
    params = 3 * (r["params"] - vanilla["params"]) * DTYPE_BYTES.get(str(r["dtype"]), 2) / 1e9 if r["depth_grad"] \
        else 0.0
    return {"formula": r["depth_kv_gb"], "buffer": buffer, "grad": grad, "params": params,
            "accounted": buffer + grad + params, "measured": measured}


def memory_markdown(frame) -> list[str]:
    rows = []
    for k, g in _groups(frame, "train"):
        base = g[g["provider"] == "vanilla"]
        if base.empty:
            continue
        vanilla = base.iloc[0].to_dict()
        for r in g.to_dict("records"):
            if not r["depth_kv_gb"] > 0:
                continue
            m = memory_row(r, vanilla)
            if math.isnan(m["measured"]):   # no CUDA peak measured
                continue
            rows.append([k["gpu"], k["model"], _run(k) or "-", f"{int(k['layers'])}", f"{int(k['B'])}x{int(k['T'])}",
                         _variant(r),
                         _f(m["formula"], ".3f"), _f(m["buffer"], ".3f"), _f(m["grad"], ".3f"), _f(m["params"], ".3f"),
                         _f(m["accounted"], ".3f"), _f(m["measured"], ".3f"),
                         _f(m["measured"] / m["formula"], ".2f"),
                         _f(round(m["measured"] - m["accounted"], 3) + 0.0, "+.3f")])
    if not rows:
        return []
    T, L, H, d, b = SEED001_EXAMPLE
    return ["### Depth-KV memory (training step): measured vs formula",
            "Formula: seed 004's retained depth-KV memory B x T x contributing entries x Hk x d x bytes x 2, the "
            "entries counted as the slots the run keeps (MoDA: 2 per earlier layer, the attention K/V and the FFN's "
            "K/V projection; Depth-Attention: the layers a later layer reads). Measured: the variant's step peak "
            "minus vanilla's in the same run (each the second step of its variant, so AdamW state exists in both). "
            "Why they differ: attached depth also holds a gradient buffer as large as the depth buffer (seed 004 "
            "detaches depth, so its formula has none); the variant's extra parameters (MoDA's FFN K/V projection) "
            "add their gradients and two AdamW moments; 'accounted' is those three. What is left ('unaccounted') "
            "is the backward's transients at its peak: where the kernel does not add its depth gradients into the "
            "gradient buffer itself (compiled MoDA, Depth-Attention's mix), the deepest layer's gradient tensor of "
            "its slice (up to the buffer's size), and a backward that needs contiguous depth K/V (MoDA's Hopper "
            "descriptor backward, taken without in-kernel accumulation) copying the strided slice (as much "
            "again); plus activations the variant saves that vanilla does not. Runs measured before the peak was "
            "read on "
            "the second step held no AdamW state in vanilla's measured step: their difference includes the "
            "optimizer state (2 x the parameters' bytes). "
            f"Seed 001's example (T={T}, L={L}, {H} KV heads, d={d}, {b} bytes) is {T * L * H * d * b * 2 / 1e9:.1f} "
            "GB by the same formula.",
            md_table(["GPU", "model", "run", "layers", "B x T", "variant", "formula GB", "buffer GB", "grad buffer GB",
                      "extra params GB", "accounted GB", "measured GB", "measured / formula", "unaccounted GB"],
                     rows)]


def traffic_markdown(frame) -> list[str]:
    """Per training run with vanilla: each depth variant's least depth K/V traffic
    (`flops.depth_traffic_bytes`), its time at the GPU's table copy rate against vanilla's step,
    beside the step time the variant measured over vanilla."""
    from moda_bench.health import known_reference
    from moda_bench.models.config import get_config
    from moda_bench.models.flops import depth_entries_read, depth_traffic_bytes
    rows = []
    for k, g in _groups(frame, "train"):
        base = g[g["provider"] == "vanilla"]
        ref = known_reference(str(k["gpu"]))
        if base.empty or ref is None:
            continue
        vanilla_ms = float(base.iloc[0]["step_ms"])
        try:
            cfg = get_config(str(k["model"])).with_layers(int(k["layers"]))
        except ValueError:
            continue
        for r in g.to_dict("records"):
            entries = depth_entries_read(cfg, str(r["provider"]))
            if not entries or r["status"] != "ok":
                continue
            gb = depth_traffic_bytes(cfg, str(r["provider"]), int(r["B"]), int(r["T"]),
                                     DTYPE_BYTES.get(str(r["dtype"]), 2), bool(r["depth_grad"])) * int(
                                         r["grad_accum"]) / 1e9
            ms = gb / ref["copy_gbps"] * 1e3
            rows.append([k["model"], _run(k) or "-", f"{int(k['layers'])}", f"{int(k['B'])}x{int(k['T'])}", _variant(r),
                         f"{entries}", _f(gb, ".2f"), _f(ms, ".1f"), _f(100 * ms / vanilla_ms, ".1f"),
                         _f(r["step_ms"] - vanilla_ms, ".1f"), _f(100 * (r["step_ms"] / vanilla_ms - 1), ".1f")])
    if not rows:
        return []
    return ["### Depth K/V traffic of a training step",
            "The least depth K/V bytes a step moves (moda_bench.models.flops.depth_traffic_bytes): every layer "
            "reads its entries' K and V in the forward and again in the backward, and with depth gradients reads "
            "and writes their gradients (a slot collects from every later layer). At the GPU's table copy rate "
            "(health.KNOWN_GPUS, conservative) that is a time a step pays unless a kernel hides it under compute; "
            "beside it, what the variant measured over vanilla (its whole overhead: kernels, extra projections, "
            "traffic).",
            md_table(["model", "run", "layers", "B x T", "variant", "entries read (sum over layers)", "traffic GB",
                      "ms at copy rate", "% of vanilla step", "measured extra ms", "measured extra %"], rows)]


def profile_figure(profiles, out_dir: Path) -> list[Path]:
    """One stacked-bar figure per (GPU, run): each variant's step time by category."""
    from moda_bench.reports.plotting import figure_style, new_figure, save_figure
    written = []
    for (gpu, sweep), g in profiles.groupby(["gpu", "sweep"], sort=True):
        g = g.assign(variant=[p + (" (detached)" if p == "moda" and dg == 0 else "")
                              for p, dg in zip(g["provider"], g["depth_grad"])])
        variants = list(dict.fromkeys(g["variant"]))
        cats = list(dict.fromkeys(g["category"]))
        with figure_style():
            fig, axes = new_figure(1, f"{sweep}: where a step's time goes ({gpu})", width_per_panel=8.0, height=4.2)
            ax = axes[0]
            bottom = [0.0] * len(variants)
            for cat in cats:
                vals = [float(g[(g["variant"] == v) & (g["category"] == cat)]["ms"].sum()) for v in variants]
                ax.bar(variants, vals, bottom=bottom, label=cat)
                bottom = [b + v for b, v in zip(bottom, vals)]
            ax.set_ylabel(f"{g['clock'].iloc[0]} time per step (ms)")
            ax.tick_params(axis="x", rotation=30)
            ax.legend(fontsize=7, ncols=2)
            slug = "".join(c if c.isalnum() else "-" for c in f"{sweep}-{gpu}".lower()).strip("-")
            written += save_figure(fig, out_dir / "figures" / f"model_profile-{slug}")
    return written


def write_models_report(results_dirs, out_dir: Path, *, figures: bool = True, warn=None) -> list[Path]:
    """out_dir/MODELS.md (and the profile figures) when model CSVs exist under results_dirs;
    [] when there are none."""
    import os

    from moda_bench.results import default_warn, read_models, read_profiles
    frame = read_models(results_dirs, warn=warn or default_warn)
    if frame.empty:
        return []
    profiles = read_profiles(results_dirs, warn=warn or default_warn)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = profile_figure(profiles, out_dir) if figures and not profiles.empty else []
    md = ["# Whole-model steps (`moda-bench model`)",
          f"Generated by `moda-bench report` from {frame['_file'].nunique()} model CSV file(s), {len(frame)} row(s). "
          "Step ms: median of interleaved rounds (CUDA) with the paired 95% interval of the ratio to vanilla; "
          "model FLOPs: 6 N per trained token + attention and each variant's own terms (moda_bench.models.flops); "
          "MFU against the doctor's table peak of the GPU. Seed columns are the seeds' own hardware and plain-PyTorch "
          "implementations: compare the ratios, not the seconds."]
    for title, part in (("## Training step", train_markdown(frame)), ("## Generation", generate_markdown(frame)),
                        ("## Memory", memory_markdown(frame)), ("## Depth traffic", traffic_markdown(frame))):
        if part:
            md += [title] + part
    links = [os.path.relpath(p, out_dir).replace(os.sep, "/") for p in written if p.suffix == ".png"]
    if links:
        md += ["## Where the time goes"] + [f"![{Path(link).stem}]({link})" for link in links]
    md.append("Input files: " + ", ".join(f"`{f}`" for f in sorted(frame["_file"].unique())) + ".")
    path = out_dir / "MODELS.md"
    path.write_text("\n\n".join(md) + "\n", encoding="utf-8", newline="\n")
    return sorted(written + [path])
