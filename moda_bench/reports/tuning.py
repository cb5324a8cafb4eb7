"""The report's "Tuning decisions" block: the tuner's CSV summaries (`results.read_tuning`), one
table per GPU, a line per tuned shape (cache key): the built-in default's and the search winner's
fwd+bwd ms, the winner's time over the default's with the 95% interval of the interleaved
comparison, the margin, the decision ('tuned': kept and shipped by `--export-shipped`;
'default': kept the default), for kept winners the config fields that differ from the default
config of that shape, the operator tuned (`op_of`: moda, moda-fa4 or moda-overlap, from the cache
key) and the summary file. No torch or triton: the fields come from the summary.
"""
from __future__ import annotations

import json
from math import isnan

from moda_bench.reports.markdown import md_table
from moda_bench.reports.vocab import MISSING, fmt_ci, fmt_int, fmt_ms, fmt_num

TUNING_INTRO = (
    "## Tuning decisions\n\n`moda-bench tune` per shape: the search's winner (candidate) and the built-in "
    "default config timed on fwd+bwd in interleaved rounds; `candidate/default` is the ratio of their times "
    "with its 95% interval. A winner is kept (`tuned`) only where the interval's upper end is below "
    "1 - `min gain`; kept winners ship in `moda_bench/kernels/moda/tuned/<gpu>.json` and run with no flag. "
    "Summaries from before the interleaved comparison show the ratio of medians without an interval; "
    "that tuner stored any config with a faster median (`faster median`, no margin), and those are not shipped. "
    "A kept default's candidate is, since 2026-11-27, the search's closest candidate where nothing was faster on "
    "its own pass. `op`: the operator tuned; `summary`: the tuner's CSV.")


def op_of(cache_key) -> str:
    """The operator a cache key belongs to: its first field where that names a MoDA operator
    (`moda-fa4|...`, `moda-overlap|...`), else `moda` (whose keys start with the GPU name)."""
    head = str(cache_key).split("|", 1)[0]
    return head if head.startswith("moda") else "moda"


def changed_fields(row) -> str:
    """A kept winner's config fields that differ from the shape's default config, as the tuner
    recorded them (`tuned_fields`); summaries from before that column show the winner's depth
    placements from its config instead. MISSING for a 'default' decision."""
    if str(row["decision"]).strip() == "default":
        return MISSING
    if str(row["tuned_fields"]).strip():
        return str(row["tuned_fields"]).strip()
    try:
        cfg = json.loads(row["config"])
    except (TypeError, ValueError):
        return MISSING
    shown = [f"{k}={cfg[k]}" for k in ("fwd_depth", "bwd_depth") if k in cfg]
    return (" ".join(shown) + " (placements; changed fields not recorded)") if shown else MISSING


def tuning_markdown(frame) -> str:
    """The block for a `read_tuning` frame (empty string without rows)."""
    if frame.empty:
        return ""
    out = [TUNING_INTRO]
    gpus = sorted({str(g) for g in frame["gpu"]})
    for gpu in gpus:
        part = frame[frame["gpu"].astype(str) == gpu]
        rows = []
        for _, r in part.iterrows():
            ratio = r["ratio"]
            if isnan(ratio) and not isnan(r["candidate_ms"]) and r["default_ms"] > 0:
                ratio = r["candidate_ms"] / r["default_ms"]
            rows.append([fmt_int(r["T"]), fmt_int(r["G"]), fmt_int(r["L"]), fmt_int(r["d"]), str(r["dtype"]),
                         fmt_ms(r["default_ms"]), fmt_ms(r["candidate_ms"]), fmt_ms(r["tuned_ms"]),
                         fmt_ci(ratio, r["ratio_lo"], r["ratio_hi"]), fmt_num(100 * r["min_gain"], ".0f", "%"),
                         str(r["decision"]), fmt_num(r["speedup"], ".3f", "x"), changed_fields(r),
                         op_of(r["cache_key"]), str(r.get("_file", MISSING))])
        out.append(f"### Tuning decisions on {gpu or 'an unnamed GPU'}\n\n" + md_table(
            ["T", "G", "L", "d", "dtype", "default ms", "candidate ms", "stored ms", "candidate/default",
             "min gain", "decision", "speedup", "kept config (fields changed)", "op", "summary"], rows))
    return "\n\n".join(out)
