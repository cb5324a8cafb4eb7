"""`moda-bench gate`'s judgement: whether a provider got slower than a stored baseline, from two
results CSVs and without a GPU. The command (options, messages, exit codes, the GPU health checks
of `--run`) is `moda_bench.cli.gate`; the measurements of `--run` are `moda_bench.bench.gate`,
which asks this module (`Recheck`) which rows to measure again; the table, verdict and
Markdown of a result are `moda_bench.reports.gate_text`.

Both CSVs are read through `moda_bench.results` (`read_run`); rows are matched on
`schema.KEY_COLUMNS` (not the sweep name), the last row of a repeated key wins, and a baseline row
counts when its status is ok and it has a median_ms. Value per row (`metric`) and its interval:

* ``ratio`` (default): ``ratio_to_fa2`` and its paired 95% interval ``ratio_to_fa2_lo/_hi``; the
  fa2 rows are ``REFERENCE`` (ratio 1 by definition: time change shown, never gated).
* ``ratio-best``: ``ratio_to_best`` (+ _lo/_hi), against the fastest sequence-only attention of
  the point (``best_provider``, e.g. fa4 on Hopper); the best provider of both runs is REFERENCE.
* ``time``: ``median_ms`` with the interval ``[p20_ms, p80_ms]``; every provider is gated.

Decision (like NVBench's compare), threshold ``t``: the change ``current / baseline - 1`` gets an
interval from both rows' intervals, combined in quadrature on a log scale (a row without an
interval counts as exact, so against an exact baseline this is the current interval against
``baseline * (1 +- t)``):

* ``SLOW``  (regression): the change interval lies entirely above ``+t``;
* ``FAST``: entirely below ``-t``;
* ``AMBIGUOUS``: the point change is beyond ``+-t`` but its interval reaches into the band, or
  the interval is wider than the band (reaches beyond both ``-t`` and ``+t``);
* ``SAME``: otherwise (point change within ``+-t``).

A ratio row whose current file has no interval (older files, custom timers) falls back to the
previous rule: the ratio is computed from the medians of the provider and its reference (fa2,
or the run's best_provider; looked up with the full configuration, else ignoring L and C) with
the noise band ``[P.p20 / F.p80, P.p80 / F.p20]``; SLOW iff ``change > t`` and the current band
lies above the baseline band, FAST mirrored, AMBIGUOUS for ``|change| > t`` inside the noise,
else SAME. Without a reference row in one run the row is compared on time (said in `detail`).

Other categories: ``FAILED`` (ok in baseline, error/oom now, or its forward no longer bitwise
repeatable: ``repeat_err`` > 0 now, 0 or unmeasured in the baseline), ``MISSING`` (ok in baseline;
absent, skipped or without a value now), ``NEW`` (ok in current only). SLOW and FAILED fail the
gate; MISSING fails unless ``allow_missing``; AMBIGUOUS only with ``fail_ambiguous``.

`GateInputError` (exit code 2): unreadable or non-results files (one line naming file, line and
column), missing columns, no ok baseline rows, rows whose ``health`` is not '', 'healthy' or
'unknown' (a degraded or shared GPU), different GPU names, no configuration in common.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import pandas as pd

from moda_bench import results as results_io
from moda_bench import schema
from moda_bench.bench.gate import GateInputError
from moda_bench.bench.spec import Metric

REFERENCE_PROVIDER = "fa2"
REQUIRED_COLUMNS = [c for c in schema.KEY_COLUMNS if c != "timer"] + ["median_ms", "p20_ms", "p80_ms",
                                                                      "status", "gpu"]
POINT_KEY = ["pass", "timer"] + schema.CONFIG_COLUMNS
# fa2 and the other sequence-only providers do not depend on the depth/chunk axes: fallback match
POINT_FALLBACK_KEY = ["pass", "timer"] + [c for c in schema.CONFIG_COLUMNS if c not in ("L", "C")]
BROKEN_STATUSES = (schema.OOM, schema.ERROR)
HEALTHY = ("", "healthy", "unknown")

# category -> rich style, in display order (worst first)
CATEGORIES = {"FAILED": "bold red", "SLOW": "bold red", "MISSING": "yellow", "AMBIGUOUS": "magenta",
              "NEW": "cyan", "FAST": "green", "SAME": "dim", "REFERENCE": "dim"}
COMPARED = ("SLOW", "FAST", "SAME", "AMBIGUOUS", "REFERENCE")
QUIET = ("SAME", "REFERENCE")


# metric -> (value, interval low, interval high) columns
METRIC_COLUMNS = {"ratio": ("ratio_to_fa2", "ratio_to_fa2_lo", "ratio_to_fa2_hi"),
                  "ratio-best": ("ratio_to_best", "ratio_to_best_lo", "ratio_to_best_hi"),
                  "time": ("median_ms", "p20_ms", "p80_ms")}
TIME = METRIC_COLUMNS["time"]
RESULT_COLUMNS = schema.KEY_COLUMNS + ["category", "metric", "interval", "base", "base_lo", "base_hi",
                                       "current", "current_lo", "current_hi", "change", "change_lo",
                                       "change_hi", "detail"]


@dataclass
class GateResult:
    """Outcome of `compare`: one row per key of either run (RESULT_COLUMNS; changes are fractions)."""

    rows: pd.DataFrame
    threshold: float
    metric: str
    baseline_gpus: list[str] = field(default_factory=list)
    current_gpus: list[str] = field(default_factory=list)
    allow_missing: bool = False
    fail_ambiguous: bool = False

    @property
    def counts(self) -> dict[str, int]:
        vc = self.rows["category"].value_counts()
        return {c: int(vc.get(c, 0)) for c in CATEGORIES}

    @property
    def gating(self) -> tuple[str, ...]:
        """The categories that fail the gate under this result's policy."""
        return (("FAILED", "SLOW") + (() if self.allow_missing else ("MISSING",))
                + (("AMBIGUOUS",) if self.fail_ambiguous else ()))

    @property
    def failed(self) -> bool:
        """True when a row fails the gate (exit 1)."""
        return bool(self.rows["category"].isin(self.gating).any())

    @property
    def n_compared(self) -> int:
        return int(self.rows["category"].isin(COMPARED).sum())

    def of(self, category: str) -> pd.DataFrame:
        return self.rows[self.rows["category"] == category]


# ----------------------------------------------------------------------------- input
def read_run(path: Path, what: str, warn: Optional[Callable[[str], None]] = None) -> pd.DataFrame:
    """One results CSV (`results.read_csv`); GateInputError, one line naming `what` and the file
    (and line, column), for a missing, empty, unreadable, non-results or row-less file."""
    try:
        df = results_io.read_csv(path, warn=warn or results_io.default_warn)
    except results_io.ResultsError as exc:
        raise GateInputError(f"{what}: {exc}") from None
    if df.empty:
        raise GateInputError(f"{what}: {path}: file has no rows")
    return df


def check_columns(df: pd.DataFrame, what: str) -> None:
    """GateInputError naming the columns the gate needs that df lacks."""
    if missing := [c for c in REQUIRED_COLUMNS if c not in df.columns]:
        raise GateInputError(f"{what} CSV does not match the schema: missing column(s) {', '.join(missing)}")


def check_health(df: pd.DataFrame, what: str) -> None:
    """GateInputError when rows were measured on an unhealthy GPU (`health` not '', 'healthy' or
    'unknown'): one line with the (most frequent) reason and the number of such rows."""
    if "health" not in df.columns:
        return
    health = df["health"].map(lambda h: "" if is_blank(h) else str(h).strip())
    bad = health[~health.isin(HEALTHY)]
    if bad.empty:
        return
    reasons = bad.value_counts()
    where = f" ({df['_file'].iloc[0]})" if "_file" in df.columns and len(df) else ""
    more = f" and {len(reasons) - 1} other reason(s)" if len(reasons) > 1 else ""
    raise GateInputError(f"{what}{where}: {len(bad)} of {len(df)} row(s) were measured on an unhealthy GPU "
                         f"(health '{reasons.index[0]}'{more}): not comparable; measure again on a healthy GPU")


def cell_text(value) -> str:
    """Canonical text of a key cell so 64, 64.0 and '64' match and NaN matches NaN."""
    if is_blank(value):
        return ""
    text = str(value).strip()
    try:
        f = float(text)
    except ValueError:
        return text.removeprefix("torch.")
    return str(int(f)) if f.is_integer() else repr(f)


def is_blank(value) -> bool:
    """An empty cell: NaN/None (pandas' reading) or '' (results.read_csv's text columns)."""
    return value is None or (not isinstance(value, str) and pd.isna(value)) or value == ""


def cell_num(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _prepare(df: pd.DataFrame, what: str) -> pd.DataFrame:
    """Checked copy with every schema column, timer defaulted, canonical key columns (k_<col>) and
    duplicates resolved to the last row."""
    check_columns(df, what)
    out = df.reindex(columns=list(df.columns) + [c for c in schema.COLUMNS if c not in df.columns])
    out["timer"] = [cell_text(t) or schema.DEFAULT_TIMER for t in out["timer"]]
    for c in schema.KEY_COLUMNS:   # a configuration column a row predates reads as its default
        out[c] = [schema.CONFIG_DEFAULTS[c] if c in schema.CONFIG_DEFAULTS and is_blank(v) else v for v in out[c]]
        out["k_" + c] = out[c].map(cell_text)
    kcols = ["k_" + c for c in schema.KEY_COLUMNS]
    return out.drop_duplicates(subset=kcols, keep="last").reset_index(drop=True)


def _gpus(df: pd.DataFrame) -> list[str]:
    return sorted({"unknown" if is_blank(g) else str(g) for g in df[df["status"] == schema.OK]["gpu"]})


# ----------------------------------------------------------------------------- decisions
def _triple(row, cols) -> tuple[float, float, float, bool] | None:
    """(value, lo, hi, has_interval) of the columns; None without a positive value. An invalid
    or absent interval collapses to the value."""
    v, lo, hi = (cell_num(row[c]) for c in cols)
    if not math.isfinite(v) or v <= 0:
        return None
    has = math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= v <= hi
    return (v, lo, hi, True) if has else (v, v, v, False)


def classify_interval(base: tuple, cur: tuple, threshold: float) -> dict:
    """NVBench-like decision on (value, lo, hi) of baseline and current (module docstring)."""
    (b, b_lo, b_hi), (c, c_lo, c_hi) = base[:3], cur[:3]
    d = math.log(c / b)
    down = math.hypot(math.log(c / c_lo), math.log(b_hi / b))
    up = math.hypot(math.log(c_hi / c), math.log(b / b_lo))
    change, lo, hi = c / b - 1.0, math.expm1(d - down), math.expm1(d + up)
    t = threshold
    category, why = ("SLOW" if lo > t else "FAST" if hi < -t else "SAME"), ""
    if category == "SAME" and abs(change) > t:
        category, why = "AMBIGUOUS", f"beyond {t * 100:g}% but the interval reaches into the band"
    elif category == "SAME" and lo < -t and hi > t:
        category, why = "AMBIGUOUS", f"interval wider than the +-{t * 100:g}% band"
    return dict(category=category, change=change, change_lo=lo, change_hi=hi, detail=why)


def classify_band(base: tuple, cur: tuple, threshold: float) -> dict:
    """The rule for rows without an interval: the point change and the p20-p80 noise bands."""
    change = cur[0] / base[0] - 1.0
    category = ("SLOW" if change > threshold and cur[1] > base[2] else
                "FAST" if change < -threshold and cur[2] < base[1] else
                "AMBIGUOUS" if abs(change) > threshold else "SAME")
    why = "beyond the threshold but inside the p20-p80 noise" if category == "AMBIGUOUS" else ""
    return dict(category=category, change=change, change_lo=math.nan, change_hi=math.nan, detail=why)


def _band_tables(ok: pd.DataFrame) -> tuple[dict, dict]:
    """(exact, fallback): (point key..., provider) -> time band of the run's ok rows; the
    fallback ignores L and C (median over the rows that share the rest)."""
    exact = {}
    for _, r in ok.iterrows():
        t = _triple(r, TIME)
        if t is not None:
            exact[tuple(r["k_" + c] for c in POINT_KEY) + (r["k_provider"],)] = t
    fallback = {}
    for key, grp in ok.groupby(["k_" + c for c in POINT_FALLBACK_KEY] + ["k_provider"]):
        t = _triple({c: grp[c].median() for c in TIME}, TIME)
        if t is not None:
            fallback[tuple(key)] = t
    return exact, fallback


def _lookup(row, provider: str, tables) -> tuple | None:
    if not provider:
        return None
    exact, fallback = tables
    found = exact.get(tuple(row["k_" + c] for c in POINT_KEY) + (provider,))
    return found or fallback.get(tuple(row["k_" + c] for c in POINT_FALLBACK_KEY) + (provider,))


def _ratio_band(p: tuple, f: tuple) -> tuple[float, float, float]:
    """Ratio P/F with the conservative band [P.lo / F.hi, P.hi / F.lo]."""
    return p[0] / f[0], p[1] / f[2], p[2] / f[1]


def _best(row) -> str:
    return "" if is_blank(row["best_provider"]) else str(row["best_provider"]).strip()


def _judge(b, c, metric: str, tables: tuple, threshold: float, reference: str) -> dict:
    """Category and values of a key ok in both runs (module docstring)."""
    bt, ct = _triple(b, TIME), _triple(c, TIME)
    detail = ""
    if metric != "time":
        prov = b["k_provider"]
        is_ref = prov == reference if metric == "ratio" else prov == _best(b) == _best(c)
        if is_ref:
            out = classify_interval(bt, ct, threshold)
            return dict(out, category="REFERENCE", metric="time", interval="p20-p80", base=bt, current=ct,
                        detail="reference: not gated")
        if metric == "ratio-best" and _best(b) != _best(c):
            detail = f"best: {_best(b) or '?'} -> {_best(c) or '?'}"
        bv, cv = _triple(b, METRIC_COLUMNS[metric]), _triple(c, METRIC_COLUMNS[metric])
        if bv is not None and cv is not None and cv[3]:
            out = classify_interval(bv, cv, threshold)
            return dict(out, metric=metric, interval="95% CI", base=bv, current=cv,
                        detail="; ".join(x for x in (out["detail"], detail) if x))
        refs = [("ratio-best", _best), ("ratio", lambda r: reference)] if metric == "ratio-best" \
            else [("ratio", lambda r: reference)]
        for label, ref_of in refs:
            fb, fc = _lookup(b, ref_of(b), tables[0]), _lookup(c, ref_of(c), tables[1])
            if fb is not None and fc is not None:
                bv, cv = _ratio_band(bt, fb), _ratio_band(ct, fc)
                out = classify_band(bv, cv, threshold)
                note = "no interval: median ratio, p20-p80 bands" + ("" if label == metric else f" ({label})")
                return dict(out, metric=label, interval="p20-p80", base=bv, current=cv,
                            detail="; ".join(x for x in (out["detail"], note, detail) if x))
            side = "baseline" if fb is None else "current"
        tried = reference if metric == "ratio" else f"best_provider or {reference}"
        detail = "; ".join(x for x in (f"no {tried} row in {side}: time compared", detail) if x)
    out = classify_interval(bt, ct, threshold)
    return dict(out, metric="time", interval="p20-p80", base=bt, current=ct,
                detail="; ".join(x for x in (out["detail"], detail) if x))


def compare(baseline_df: pd.DataFrame, current_df: pd.DataFrame, threshold: float = 0.05,
            metric: str = "ratio", allow_gpu_change: bool = False, reference: str = REFERENCE_PROVIDER,
            allow_missing: bool = False, fail_ambiguous: bool = False) -> GateResult:
    """Classify every key of the two runs (rules in the module docstring).

    Raises GateInputError for missing columns, unhealthy rows, no ok baseline rows, or different
    GPU names (unless allow_gpu_change).
    """
    metric = Metric(metric).value
    base, cur = _prepare(baseline_df, "baseline"), _prepare(current_df, "current")
    check_health(base, "baseline")
    check_health(cur, "current")
    measured = lambda df: df[(df["status"] == schema.OK) & df["median_ms"].map(cell_num).gt(0)]  # noqa: E731
    base_ok, cur_ok = measured(base), measured(cur)
    if base_ok.empty:
        raise GateInputError("baseline has no rows with status 'ok' and a median_ms")
    base_gpus, cur_gpus = _gpus(base), _gpus(cur)
    if cur_gpus and base_gpus != cur_gpus and not allow_gpu_change:
        raise GateInputError(f"GPU changed: baseline ran on {', '.join(base_gpus)}, current on "
                             f"{', '.join(cur_gpus)} (pass --allow-gpu-change to compare anyway)")

    kcols = ["k_" + c for c in schema.KEY_COLUMNS]
    tables = (_band_tables(base_ok), _band_tables(cur_ok))
    cur_ok_by_key = {tuple(r[kcols]): r for _, r in cur_ok.iterrows()}
    cur_any_by_key = {tuple(r[kcols]): r for _, r in cur.iterrows()}
    base_keys, records = set(), []
    for _, b in base_ok.iterrows():
        key = tuple(b[kcols])
        base_keys.add(key)
        rec = {col: b[col] for col in schema.KEY_COLUMNS}
        c = cur_ok_by_key.get(key)
        if c is not None:
            out = _judge(b, c, metric, tables, threshold, reference)
            for side in ("base", "current"):
                v = out.pop(side)
                out.update({side: v[0], side + "_lo": v[1], side + "_hi": v[2]})
            rec.update(out)
            if cell_num(c.get("repeat_err")) > 0 and not cell_num(b.get("repeat_err")) > 0:
                rec.update(category="FAILED", detail=f"forward not repeatable now (repeat_err "
                           f"{cell_num(c.get('repeat_err')):.2e}): a race or an uninitialised read")
        else:
            bt = _triple(b, TIME)
            rec.update(metric="time", interval="p20-p80", base=bt[0], base_lo=bt[1], base_hi=bt[2])
            other = cur_any_by_key.get(key)
            status = None if other is None else other["status"]
            reason = "" if other is None or is_blank(other.get("reason")) else f": {other['reason']}"
            rec.update(category="FAILED" if status in BROKEN_STATUSES else "MISSING",
                       detail="not in current" if other is None else "current row has no median_ms"
                       if status == schema.OK else f"current status {status}{reason}")
        records.append(rec)
    for key, c in cur_ok_by_key.items():
        if key not in base_keys:
            ct = _triple(c, TIME)
            records.append(dict({col: c[col] for col in schema.KEY_COLUMNS}, category="NEW", metric="time",
                                interval="p20-p80", current=ct[0], current_lo=ct[1], current_hi=ct[2],
                                detail="not in baseline"))

    rows = pd.DataFrame.from_records(records).reindex(columns=RESULT_COLUMNS)
    order = {c: i for i, c in enumerate(CATEGORIES)}
    rows = rows.sort_values(by=["category", "change"], key=lambda s: s.map(order) if s.name == "category"
                            else -s.fillna(0), kind="stable").reset_index(drop=True)
    return GateResult(rows=rows, threshold=threshold, metric=metric, baseline_gpus=base_gpus,
                      current_gpus=cur_gpus, allow_missing=allow_missing, fail_ambiguous=fail_ambiguous)


def require_overlap(result: GateResult) -> GateResult:
    """result, or GateInputError when no configuration was compared and none broke (nothing judged)."""
    if result.n_compared == 0 and not result.counts["FAILED"]:
        missing = result.counts["MISSING"]
        raise GateInputError("baseline and current have no ok configuration in common: nothing to compare"
                             + (f" ({missing} baseline row(s) without a current measurement)" if missing else ""))
    return result


# ----------------------------------------------------------------------------- --run: what to measure again
def remeasure_plan(result: GateResult, baseline_df: pd.DataFrame, current_df: pd.DataFrame,
                   reference: str = REFERENCE_PROVIDER) -> pd.DataFrame:
    """Rows (key columns, status ok) to measure again: every AMBIGUOUS row, with the reference
    provider and the best_provider(s) of either run at that point, so its ratios are paired."""
    helpers: dict[tuple, set] = {}
    for df in (_prepare(baseline_df, "baseline"), _prepare(current_df, "current")):
        for _, r in df[(df["status"] == schema.OK) & (df["best_provider"].map(cell_text) != "")].iterrows():
            helpers.setdefault(tuple(r["k_" + c] for c in POINT_FALLBACK_KEY), set()).add(_best(r))
    records = []
    for _, r in result.of("AMBIGUOUS").iterrows():
        point = {c: r[c] for c in schema.KEY_COLUMNS if c != "provider"}
        fallback = tuple(cell_text(r[c]) for c in POINT_FALLBACK_KEY)
        for prov in [r["provider"], reference] + sorted(helpers.get(fallback, ())):
            records.append(dict(point, provider=prov, status=schema.OK))
    plan = pd.DataFrame.from_records(records, columns=schema.KEY_COLUMNS + ["status"])
    return plan[~pd.Series(key_tuples(plan), dtype=object).duplicated().to_numpy()].reset_index(drop=True)


@dataclass
class Recheck:
    """What `bench.gate.measure` asks after the first run of gate --run (bench.gate.Recheck): the
    rows that the comparison with `baseline` under `policy` (compare's keywords) finds AMBIGUOUS,
    with their reference providers (`remeasure_plan`), and how their new rows replace the first
    ones (`replace_rows`)."""

    baseline: pd.DataFrame
    policy: dict = field(default_factory=dict)

    def plan(self, first: pd.DataFrame) -> tuple[str, pd.DataFrame]:
        result = compare(self.baseline, first, **self.policy)
        return f"{result.counts['AMBIGUOUS']} AMBIGUOUS row(s)", remeasure_plan(result, self.baseline, first)

    def merge(self, first: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
        return replace_rows(first, new)


def replace_rows(current_df: pd.DataFrame, new_df: pd.DataFrame) -> pd.DataFrame:
    """current_df with the rows of new_df's keys replaced by new_df's rows (appended at the end)."""
    if new_df.empty:
        return current_df
    replaced = set(key_tuples(new_df))
    keep = [k not in replaced for k in key_tuples(current_df)]
    return pd.concat([current_df[keep], new_df], ignore_index=True)


def key_tuples(df: pd.DataFrame) -> list[tuple]:
    """The canonical KEY_COLUMNS tuple of every row (a blank timer reads as the default)."""
    defaults = dict(schema.CONFIG_DEFAULTS, timer=schema.DEFAULT_TIMER)
    cols = [[cell_text(v) or cell_text(defaults.get(c)) for v in df[c]] for c in schema.KEY_COLUMNS]
    return list(zip(*cols)) if len(df) else []
