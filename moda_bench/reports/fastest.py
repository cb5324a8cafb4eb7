"""One "fastest attention" per GPU and point for the whole report.

A row's `ratio_to_best` in the CSVs is relative to the fastest sequence-only provider of ITS OWN
run; runs that timed fewer peers (e.g. only moda and fa2) then read as close to "the fastest"
while a faster attention (fa4) measured elsewhere on the same GPU is ignored. Here the denominator
of every "/ fastest" cell and figure is the fastest sequence attention (`vocab.SEQUENCE_ONLY`:
fa2, fa4, cudnn, fa2-triton; never a MoDA variant, and not `flex`, which computes MoDA) measured
on that GPU at that point by ANY run the report reads, named with its run (the folder of its
file). A ratio whose two times come from different runs is marked (`cross_run`), as it is not
paired: the two were timed in different processes, maybe on different days. Where the fastest is
the row's own run's best_provider, the CSV's paired ratio (with its interval) is kept.

The point of a sequence attention is (GPU, pass, timer, T, Hq, Hk, B, d, dtype): its time does
not depend on L, C or the depth settings of the MoDA rows beside it.
"""
from __future__ import annotations

import posixpath

from moda_bench import schema
from moda_bench.reports.vocab import SEQUENCE_ONLY, has_text

POINT = ["_gpu", "pass", "timer", "T", "Hq", "Hk", "B", "d", "dtype"]
CROSS_MARK = "\u2020"   # the dagger after a ratio whose two times come from different runs


def run_of(files):
    """The run (folder of the file) of each row."""
    return files.map(lambda f: posixpath.dirname(str(f)) or ".")


def _keyed(rows):
    gpu = rows["gpu"].map(lambda g: str(g).strip() if has_text(g) else "")
    run = run_of(rows["_file"]) if "_file" in rows else rows["gpu"].map(lambda _: ".")
    return rows.assign(_gpu=gpu, _run=run, timer=rows["timer"].fillna(schema.DEFAULT_TIMER))


def fastest_table(rows):
    """Per point (POINT), the fastest ok sequence-attention row of all the rows: fastest (its
    provider), fastest_ms, fastest_run. Ties: provider name, then run."""
    k = _keyed(rows)
    seq = k[k["provider"].isin(SEQUENCE_ONLY) & (k["status"] == schema.OK) & k["median_ms"].notna()
            & k["pass"].isin(schema.TRAIN_PASSES)]
    seq = seq.sort_values(["median_ms", "provider", "_run"], kind="stable").drop_duplicates(POINT)
    return seq[POINT + ["provider", "median_ms", "_run"]].rename(
        columns={"provider": "fastest", "median_ms": "fastest_ms", "_run": "fastest_run"})


def with_fastest(rows, table=None):
    """rows with ratio_to_best, best_provider (+ _lo/_hi) recomputed against the report-wide
    fastest (`fastest_table` of rows unless given), plus best_run (its run) and best_cross (True
    where the row's run is another). Intervals are kept only where the ratio is the CSV's paired
    one; rows with no sequence attention at their point get NaN / ''."""
    import pandas as pd
    if not len(rows):
        return rows.assign(best_run="", best_cross=False)
    table = fastest_table(rows) if table is None else table
    k = _keyed(rows).reset_index()
    m = k.merge(table, on=POINT, how="left").set_index("index").reindex(rows.index)
    has = m["fastest"].notna()
    same = has & (m["_run"] == m["fastest_run"])
    paired = same & (m["best_provider"].map(lambda b: str(b).strip() if has_text(b) else "") == m["fastest"]) \
        & m["ratio_to_best"].notna()
    ratio = (m["median_ms"] / m["fastest_ms"]).where(has)
    out = rows.copy()
    out["ratio_to_best"] = m["ratio_to_best"].where(paired, ratio)
    for c in ("ratio_to_best_lo", "ratio_to_best_hi"):
        out[c] = m[c].where(paired)
    out["best_provider"] = m["fastest"].where(has, "")
    out["best_run"] = m["fastest_run"].where(has, "")
    out["best_cross"] = (has & ~same).astype(bool)
    out.loc[out["status"] != schema.OK, ["ratio_to_best", "ratio_to_best_lo", "ratio_to_best_hi"]] = float("nan")
    return out if isinstance(out, pd.DataFrame) else pd.DataFrame(out)
