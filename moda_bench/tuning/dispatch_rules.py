"""The MoDA dispatcher's per-GPU rules from sweep CSVs (`moda-bench dispatch --rules-from RESULTS...`).

A rules file (read by `moda_bench.kernels.moda.dispatch`) lists, per measured point, the MoDA
implementations timed there, fastest first. From the CSVs under the given paths (through the one
reader, `moda_bench.results`): training passes fwd and fwdbwd, status ok, both timers (a point of
each: "eager" decides eager calls, "graph" calls captured into a CUDA graph), the providers of
`dispatch.IMPL_OF` (moda-triton, including the committed `moda` rows that were the Triton kernel,
moda-fa4, moda-overlap, moda-fused). The dispatcher's own `moda` rows count as a measurement of the
route they ran (`auto -> fused (...)` in impl_detail) only where no row of that route's provider
exists at the point, in any run: they fill gaps (an FP16 or d = 128 run that timed `moda` beside
`moda-fused` only), never override. A provider's newest row at a point counts, whichever run it came from; a point with
fewer than two implementations measured decides nothing and is left out. Implementations within
TIE (1%) of a point's fastest are tied, and the simpler one (`dispatch.IMPLS` order: triton, fa4,
overlap, fused) is ranked first. One file per GPU name in the rows, `<gpu-slug>.json`; writing
replaces that GPU's file (the rules are the whole evidence of the paths given).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pandas as pd

from moda_bench import results
from moda_bench.kernels.moda.config import gpu_slug
from moda_bench.kernels.moda.dispatch import IMPL_OF, IMPLS, PROVIDER_OF, RULES_DIR, RULES_SCHEMA_VERSION

POINT_COLUMNS = ["timer", "pass", "dtype", "d", "G", "L", "T", "B", "Hk", "Hq", "depth_grad"]
PASSES = ("fwd", "fwdbwd")
TIMERS = ("eager", "graph")
TIE = 0.01  # implementations within 1% of a point's fastest count as tied (`ranked`)
DISPATCHER = "moda"                       # the entry point's provider; its impl_detail names the route
ROUTE = r"^\s*auto\s*->\s*([a-z0-9]+)"


class RulesError(ValueError):
    """Nothing to build rules from (the message is one line)."""


@dataclass(frozen=True)
class DispatchSpec:
    """One `moda-bench dispatch` call: explain (no rules_from) or regenerate rules into out."""

    rules_from: tuple = ()
    out: Path = RULES_DIR
    graph: bool = False
    training: bool = True
    depth_grad: bool = True
    gpu: Optional[str] = None


def ranked(g, tie: float = TIE):
    """A point's rows fastest first, except that the rows within `tie` of the fastest go first in
    `dispatch.IMPLS` order (the simpler implementation wins a tie, so noise does not flip the choice)."""
    far = g["median_ms"] > g["median_ms"].min() * (1 + tie)
    key = g["provider"].map(lambda p: IMPLS.index(IMPL_OF[p])).where(~far, len(IMPLS))
    return g.assign(_far=far, _key=key).sort_values(["_far", "_key", "median_ms"], kind="stable") \
        .drop(columns=["_far", "_key"])


def routed_rows(df):
    """The dispatcher's `moda` rows of df renamed to the provider of the route they ran (impl_detail
    "auto -> <impl> ..."); rows naming no known route are dropped."""
    rows = df[df["provider"] == DISPATCHER]
    impl = rows["impl_detail"].astype(str).str.extract(ROUTE, expand=False)
    rows = rows.assign(provider=impl.map(PROVIDER_OF))
    return rows[rows["provider"].notna()]


def rules_from_frame(df, command: str = "", gpu: Optional[str] = None) -> dict:
    """{gpu name: rules dict} from a results frame (`results.read_results`); gpu: that GPU's only."""
    df = df[df["pass"].isin(PASSES) & (df["status"] == "ok") & df["timer"].isin(TIMERS) & df["median_ms"].notna()]
    direct, routed = df[df["provider"].isin(list(IMPL_OF))], routed_rows(df)
    keys = ["gpu", "provider"] + POINT_COLUMNS
    measured = pd.MultiIndex.from_frame(direct[keys].astype(str))
    df = pd.concat([direct, routed[~pd.MultiIndex.from_frame(routed[keys].astype(str)).isin(measured)]],
                   ignore_index=True)
    if gpu is not None:
        df = df[df["gpu"] == gpu]
    df, _ = results.newest(df, ["gpu", "provider"] + POINT_COLUMNS)
    out: dict = {}
    for (name, *values), g in df.groupby(["gpu"] + POINT_COLUMNS, sort=True, dropna=False):
        if g["provider"].nunique() < 2:
            continue
        g = ranked(g)
        point = dict(zip(POINT_COLUMNS, values))
        point = {k: (v if k in ("timer", "pass", "dtype") else int(v)) for k, v in point.items()}
        point["heads"] = point["B"] * point["Hk"]
        point["ranking"] = [{"impl": IMPL_OF[r["provider"]], "ms": round(float(r["median_ms"]), 4),
                             "file": r["_file"], "timestamp": r["timestamp"]} for r in g.to_dict("records")]
        rules = out.setdefault(name, {"schema_version": RULES_SCHEMA_VERSION, "gpu": name, "timers": list(TIMERS),
                                      "command": command, "sources": [], "points": []})
        rules["points"].append(point)
        rules["sources"] = sorted(set(rules["sources"]) | {e["file"] for e in point["ranking"]})
    return out


def build_rules(paths, command: str = "", warn=results.default_warn) -> dict:
    """`rules_from_frame` of every results CSV under `paths` (RulesError when no point qualifies)."""
    df = results.read_results(paths, warn=warn)
    rules = rules_from_frame(df, command)
    if not rules:
        raise RulesError(f"no point under {', '.join(map(str, paths))} has two or more of "
                         f"{', '.join(IMPL_OF)} measured (status ok, passes {', '.join(PASSES)})")
    return rules


def write_rules(rules: dict, out) -> list[Path]:
    """One `<gpu-slug>.json` per GPU of `rules` into folder `out`; returns the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in sorted(rules.items()):
        path = out / f"{gpu_slug(name)}.json"
        results.write_json_atomic(path, data, indent=1, sort_keys=True)
        written.append(path)
    return written


def summary(rules: dict) -> list[str]:
    """One line per GPU, then one per measured point: its winner and every implementation's ms."""
    lines = []
    for name, data in sorted(rules.items()):
        lines.append(f"{name}: {len(data['points'])} points from {len(data['sources'])} CSVs")
        for p in data["points"]:
            win = p["ranking"][0]
            lines.append(f"  {p['timer']:<5} {p['pass']:<6} T={p['T']:<6} G={p['G']:<3} L={p['L']:<4} d={p['d']} "
                         f"{p['dtype']}{'' if p['depth_grad'] else ' detached'}: {win['impl']} "
                         "(" + ", ".join(f"{e['impl']} {e['ms']:.3g}" for e in p["ranking"]) + " ms)")
    return lines

