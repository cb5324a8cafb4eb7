"""`moda-bench gate`'s work: judge whether a provider got slower than a stored baseline. The
command (options, messages, exit codes) is `moda_bench.cli.gate`.

Both CSVs (schema.COLUMNS, long format) are read through `moda_bench.results` (`read_run`).
Their rows are matched on `schema.KEY_COLUMNS` (provider, pass, T, G, Hq, Hk, L, B, d, C, dtype;
the sweep name is not part of the gate's key); only `status == "ok"` rows are timed comparisons.
If a key occurs more than once in one file (an appended re-run), the last row wins.

Value compared per row (`metric`):

* ``ratio`` (default): the provider's time divided by the time of the reference provider
  (``fa2``) of the *same run and configuration*, so a uniformly faster or slower machine of the
  same kind cancels out. Point value ``r = P.median / F.median``; noise band
  ``[P.p20 / F.p80, P.p80 / F.p20]`` (the spread of both rows, conservatively combined).
  The reference rows themselves have ratio 1 by definition: they are shown with their raw time
  change as category ``reference`` and never gated. The reference row is looked up with the
  same full configuration; failing that, ignoring L and C (FlashAttention has no depth/chunk).
  When either run lacks an ok reference row for a configuration, that row falls back to
  ``time`` (marked in the table).
* ``time``: ``median_ms`` with noise band ``[p20_ms, p80_ms]``. Every provider, fa2 included,
  is gated.

Decision for a row present and ok in both runs, with ``change = cur / base - 1``:

* ``regressed``  iff ``change > threshold`` AND ``cur_lo > base_hi``
  (the current band lies entirely above the baseline band: slower beyond the measured noise);
* ``improved``   iff ``change < -threshold`` AND ``cur_hi < base_lo``;
* ``unchanged``  otherwise (a move inside the threshold or inside the noise).

Other categories: ``missing`` (ok in baseline, absent or skipped in current), ``failed`` (ok in
baseline, ``error``/``oom`` in current: the provider broke on that configuration), ``new`` (ok in
current only). A missing p20/p80 collapses the band to the median (threshold-only decision).

Exit codes, set by the command from `GateResult.failed` and `GateInputError`: 0 pass; 1 at
least one ``regressed`` or ``failed`` row (0 with ``--warn-only``, which still reports); 2
unusable input (missing/empty/unreadable file, not a results CSV, a non-numeric value, missing
columns, no ok baseline rows, different GPU names without ``--allow-gpu-change``, no
configuration in common, ``--run`` without CUDA).
"""
from __future__ import annotations

import enum
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import pandas as pd

from moda_bench import results as results_io
from moda_bench import schema

REFERENCE_PROVIDER = "fa2"
REQUIRED_COLUMNS = schema.KEY_COLUMNS + ["median_ms", "p20_ms", "p80_ms", "status", "gpu"]
# fa2 does not depend on the depth/chunk axes: fallback match for the reference row
_REFERENCE_FALLBACK_KEY = ["pass"] + [c for c in schema.CONFIG_COLUMNS if c not in ("L", "C")]
BROKEN_STATUSES = (schema.OOM, schema.ERROR)

# category -> display order (worst first) and rich style
CATEGORIES = {
    "failed": "bold red", "regressed": "bold red", "missing": "yellow", "new": "cyan",
    "improved": "green", "unchanged": "dim", "reference": "dim",
}
GATING = ("failed", "regressed")


class Metric(str, enum.Enum):
    ratio = "ratio"
    time = "time"


class GateInputError(ValueError):
    """Input the gate cannot judge (exit code 2)."""


@dataclass
class GateResult:
    """Outcome of `compare`.

    rows: one row per key of either run with columns KEY_COLUMNS + [category, metric, base,
    base_lo, base_hi, current, current_lo, current_hi, change, detail] (change is a fraction).
    """

    rows: pd.DataFrame
    threshold: float
    metric: str
    baseline_gpus: list[str] = field(default_factory=list)
    current_gpus: list[str] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        vc = self.rows["category"].value_counts()
        return {c: int(vc.get(c, 0)) for c in CATEGORIES}

    @property
    def failed(self) -> bool:
        """True when a row regressed or broke (gate verdict: exit 1)."""
        return bool(self.rows["category"].isin(GATING).any())

    @property
    def n_compared(self) -> int:
        return int(self.rows["category"].isin(("improved", "unchanged", "regressed", "reference")).sum())


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
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise GateInputError(f"{what} CSV does not match the schema: missing column(s) {', '.join(missing)}")


def _canon(value) -> str:
    """Canonical text of a key cell so 64, 64.0 and '64' match and NaN matches NaN."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return ""
    text = str(value).strip()
    try:
        f = float(text)
    except ValueError:
        return text.removeprefix("torch.")
    return str(int(f)) if f.is_integer() else repr(f)


def _keyed(df: pd.DataFrame) -> pd.DataFrame:
    """Copy with canonical key columns (k_<col>), duplicates resolved to the last row."""
    out = df.copy()
    for c in schema.KEY_COLUMNS:
        out["k_" + c] = out[c].map(_canon)
    kcols = ["k_" + c for c in schema.KEY_COLUMNS]
    return out.drop_duplicates(subset=kcols, keep="last").reset_index(drop=True)


def _blank(value) -> bool:
    """An empty cell: NaN/None (pandas' reading) or '' (results.read_csv's text columns)."""
    return value is None or (not isinstance(value, str) and pd.isna(value)) or value == ""


def _gpus(df: pd.DataFrame) -> list[str]:
    ok = df[df["status"] == schema.OK]
    return sorted({"unknown" if _blank(g) else str(g) for g in ok["gpu"]})


# ----------------------------------------------------------------------------- comparison
def _band(med, p20, p80) -> tuple[float, float, float]:
    med = float(med)
    lo = float(p20) if pd.notna(p20) else med
    hi = float(p80) if pd.notna(p80) else med
    return med, min(lo, med), max(hi, med)


def _reference_table(ok: pd.DataFrame, reference: str) -> tuple[dict, dict]:
    """(exact, fallback) maps from canonical config keys to the reference (med, lo, hi) band."""
    ref = ok[ok["k_provider"] == reference]
    exact = {tuple(r["k_" + c] for c in ["pass"] + schema.CONFIG_COLUMNS):
             _band(r["median_ms"], r["p20_ms"], r["p80_ms"]) for _, r in ref.iterrows()}
    fallback = {}
    for key, grp in ref.groupby(["k_" + c for c in _REFERENCE_FALLBACK_KEY]):
        fallback[key] = _band(grp["median_ms"].median(), grp["p20_ms"].median(), grp["p80_ms"].median())
    return exact, fallback


def _lookup_reference(row, tables) -> tuple | None:
    exact, fallback = tables
    key = tuple(row["k_" + c] for c in ["pass"] + schema.CONFIG_COLUMNS)
    if key in exact:
        return exact[key]
    return fallback.get(tuple(row["k_" + c] for c in _REFERENCE_FALLBACK_KEY))


def _ratio_band(p: tuple, f: tuple) -> tuple[float, float, float]:
    """Ratio P/F with the conservative band [P.lo / F.hi, P.hi / F.lo]."""
    return p[0] / f[0], p[1] / f[2], p[2] / f[1]


def _classify(base: tuple, cur: tuple, threshold: float) -> tuple[str, float]:
    change = cur[0] / base[0] - 1.0
    if change > threshold and cur[1] > base[2]:
        return "regressed", change
    if change < -threshold and cur[2] < base[1]:
        return "improved", change
    return "unchanged", change


def compare(baseline_df: pd.DataFrame, current_df: pd.DataFrame, threshold: float = 0.05,
            metric: str = "ratio", allow_gpu_change: bool = False,
            reference: str = REFERENCE_PROVIDER) -> GateResult:
    """Classify every key of the two runs (rules in the module docstring).

    Raises GateInputError for missing columns, no ok baseline rows, or different GPU names
    (unless allow_gpu_change).
    """
    metric = Metric(metric).value
    check_columns(baseline_df, "baseline")
    check_columns(current_df, "current")
    base, cur = _keyed(baseline_df), _keyed(current_df)
    base_ok = base[base["status"] == schema.OK]
    cur_ok = cur[cur["status"] == schema.OK]
    if base_ok.empty:
        raise GateInputError("baseline has no rows with status 'ok'")
    base_gpus, cur_gpus = _gpus(base), _gpus(cur)
    if cur_gpus and base_gpus != cur_gpus and not allow_gpu_change:
        raise GateInputError(f"GPU changed: baseline ran on {', '.join(base_gpus)}, current on "
                             f"{', '.join(cur_gpus)} (pass --allow-gpu-change to compare anyway)")

    kcols = ["k_" + c for c in schema.KEY_COLUMNS]
    base_ref, cur_ref = _reference_table(base_ok, reference), _reference_table(cur_ok, reference)
    cur_ok_by_key = {tuple(r[kcols]): r for _, r in cur_ok.iterrows()}
    cur_any_by_key = {tuple(r[kcols]): r for _, r in cur.iterrows()}
    base_keys = set()
    records = []

    for _, b in base_ok.iterrows():
        key = tuple(b[kcols])
        base_keys.add(key)
        rec = {c: b[c] for c in schema.KEY_COLUMNS}
        rec.update(metric=metric, detail="")
        c = cur_ok_by_key.get(key)
        if c is None:
            b_time = _band(b["median_ms"], b["p20_ms"], b["p80_ms"])
            rec.update(metric="time", base=b_time[0], base_lo=b_time[1], base_hi=b_time[2])
            other = cur_any_by_key.get(key)
            if other is not None and other["status"] in BROKEN_STATUSES:
                reason = "" if _blank(other.get("reason")) else f": {other['reason']}"
                rec.update(category="failed", detail=f"current status {other['status']}{reason}")
            elif other is not None:
                rec.update(category="missing", detail=f"current status {other['status']}")
            else:
                rec.update(category="missing", detail="not in current")
            records.append(rec)
            continue
        b_time = _band(b["median_ms"], b["p20_ms"], b["p80_ms"])
        c_time = _band(c["median_ms"], c["p20_ms"], c["p80_ms"])
        b_val, c_val, row_metric = b_time, c_time, "time"
        if metric == "ratio":
            if b["k_provider"] == reference:
                _, change = _classify(b_time, c_time, threshold)
                rec.update(category="reference", metric="time", base=b_time[0], current=c_time[0],
                           base_lo=b_time[1], base_hi=b_time[2], current_lo=c_time[1],
                           current_hi=c_time[2], change=change,
                           detail="reference: not gated")
                records.append(rec)
                continue
            fb, fc = _lookup_reference(b, base_ref), _lookup_reference(c, cur_ref)
            if fb is not None and fc is not None:
                b_val, c_val, row_metric = _ratio_band(b_time, fb), _ratio_band(c_time, fc), "ratio"
            else:
                rec["detail"] = f"no {reference} row in {'baseline' if fb is None else 'current'}: time compared"
        category, change = _classify(b_val, c_val, threshold)
        rec.update(category=category, metric=row_metric, base=b_val[0], base_lo=b_val[1], base_hi=b_val[2],
                   current=c_val[0], current_lo=c_val[1], current_hi=c_val[2], change=change)
        records.append(rec)

    for key, c in cur_ok_by_key.items():
        if key not in base_keys:
            rec = {col: c[col] for col in schema.KEY_COLUMNS}
            rec.update(category="new", metric="time", current=float(c["median_ms"]),
                       detail="current median_ms shown")
            records.append(rec)

    columns = schema.KEY_COLUMNS + ["category", "metric", "base", "base_lo", "base_hi", "current",
                                    "current_lo", "current_hi", "change", "detail"]
    rows = pd.DataFrame.from_records(records).reindex(columns=columns)
    order = {c: i for i, c in enumerate(CATEGORIES)}
    rows = rows.sort_values(by=["category", "change"], key=lambda s: s.map(order) if s.name == "category"
                            else -s.fillna(0), kind="stable").reset_index(drop=True)
    return GateResult(rows=rows, threshold=threshold, metric=metric, baseline_gpus=base_gpus,
                      current_gpus=cur_gpus)


def require_overlap(result: GateResult) -> GateResult:
    """result, or GateInputError when the two runs share no ok configuration (nothing judged)."""
    if result.n_compared == 0 and not result.failed:
        raise GateInputError("baseline and current have no ok configuration in common: nothing to compare")
    return result


# ----------------------------------------------------------------------------- rendering
def _config_text(row, columns=("pass",) + tuple(schema.CONFIG_COLUMNS)) -> str:
    """'T=4096 G=8 ... bfloat16' over the given key columns (pass and dtype shown bare)."""
    parts = [_canon(row[c]) if c in ("pass", "dtype") else f"{c}={_canon(row[c]) or '-'}" for c in columns]
    return " ".join(parts) or "-"


def _split_config(rows: pd.DataFrame) -> tuple[list[str], str]:
    """(columns that vary between rows, text of the columns constant over all rows)."""
    cols = ["pass"] + schema.CONFIG_COLUMNS
    varying = [c for c in cols if rows[c].map(_canon).nunique() > 1]
    constant = [c for c in cols if c not in varying]
    return varying, (_config_text(rows.iloc[0], constant) if len(rows) and constant else "")


def _fmt(value, metric: str, unit: bool = True) -> str:
    if value is None or pd.isna(value):
        return "-"
    return f"{value:.3f}" if metric == "ratio" else f"{value:.4g}" + (" ms" if unit else "")


def _fmt_band(lo, hi, metric: str) -> str:
    if pd.isna(lo) or pd.isna(hi):
        return ""
    return f"[{_fmt(lo, metric, False)}, {_fmt(hi, metric, False)}]"


def _fmt_change(change) -> str:
    return "-" if change is None or pd.isna(change) else f"{change * 100:+.1f}%"


def verdict_text(result: GateResult) -> str:
    counts = result.counts
    if result.failed:
        return f"FAIL: {counts['regressed']} regressed, {counts['failed']} failed"
    return "PASS"


def _rows_to_show(result: GateResult, all_rows: bool) -> tuple[pd.DataFrame, int]:
    if all_rows:
        return result.rows, 0
    quiet = result.rows["category"].isin(("unchanged", "reference"))
    return result.rows[~quiet], int(quiet.sum())


def _value_text(r, which: str, band: bool) -> str:
    """Value, with its p20-p80 band on a second line (units in the metric column)."""
    text = _fmt(r[which], r["metric"], unit=False)
    band_text = _fmt_band(r[which + "_lo"], r[which + "_hi"], r["metric"]) if band else ""
    return text + ("\n" + band_text if band_text else "")


def print_report(result: GateResult, console, all_rows: bool = False) -> None:
    """Rich table of the comparison (configuration columns that vary) plus a one-line verdict.

    The p20-p80 bands are shown when the console is at least 110 columns wide.
    """
    from rich.table import Table

    shown, hidden = _rows_to_show(result, all_rows)
    varying, constant = _split_config(result.rows)
    bands = console.width >= 110
    table = Table(title=f"moda-bench gate ({result.metric}, threshold {result.threshold * 100:g}%)",
                  caption=f"all rows: {constant}" if constant else None)
    head = "\n[p20, p80]" if bands else ""
    for name, justify, no_wrap in [("category", "left", True), ("provider", "left", False),
                                   ("config", "left", False), ("metric", "left", True),
                                   ("baseline" + head, "right", bands), ("current" + head, "right", bands),
                                   ("change", "right", True), ("detail", "left", False)]:
        table.add_column(name, justify=justify, no_wrap=no_wrap, overflow="fold")
    for _, r in shown.iterrows():
        table.add_row(f"[{CATEGORIES[r['category']]}]{r['category']}[/]", str(r["provider"]),
                      _config_text(r, varying), "ms" if r["metric"] == "time" else r["metric"],
                      _value_text(r, "base", bands), _value_text(r, "current", bands),
                      _fmt_change(r["change"]), str(r["detail"]))
    if len(shown):
        console.print(table)
    if hidden:
        console.print(f"[dim]{hidden} unchanged/reference row(s) not shown (--all-rows to list them)[/]")
    counts = ", ".join(f"{n} {c}" for c, n in result.counts.items() if n)
    style = "bold red" if result.failed else "bold green"
    console.print(f"[{style}]{verdict_text(result)}[/] ({counts})")


def markdown_summary(result: GateResult, baseline: str, current: str) -> str:
    """GitHub-flavoured Markdown: verdict, counts, the changed rows, all rows in <details>."""
    counts = result.counts
    icon = ":x:" if result.failed else ":white_check_mark:"
    lines = [
        f"## {icon} moda-bench gate: {verdict_text(result)}",
        "",
        f"- baseline: `{baseline}` ({', '.join(result.baseline_gpus) or 'unknown GPU'})",
        f"- current: `{current}` ({', '.join(result.current_gpus) or 'unknown GPU'})",
        f"- metric: `{result.metric}`, threshold {result.threshold * 100:g}% beyond the p20-p80 noise band",
        "- " + " | ".join(f"{c}: {n}" for c, n in counts.items()),
        "",
    ]

    def table(df: pd.DataFrame) -> list[str]:
        out = ["| category | provider | pass | config | metric | baseline | current | change | detail |",
               "|---|---|---|---|---|---:|---:|---:|---|"]
        for _, r in df.iterrows():
            detail = str(r["detail"]).replace("|", "\\|")
            out.append(f"| {r['category']} | {r['provider']} | {r['pass']} | {_config_text(r)} | {r['metric']} | "
                       f"{_fmt(r['base'], r['metric'])} | {_fmt(r['current'], r['metric'])} | "
                       f"{_fmt_change(r['change'])} | {detail} |")
        return out

    changed, _ = _rows_to_show(result, all_rows=False)
    if len(changed):
        lines += table(changed) + [""]
    else:
        lines += ["No row changed beyond the threshold and the noise.", ""]
    lines += ["<details><summary>All rows</summary>", ""] + table(result.rows) + ["", "</details>", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- --run
def points_from_baseline(df: pd.DataFrame) -> dict[str, tuple[list, list[str]]]:
    """pass -> (unique runner.Point list, provider list) of the baseline's ok rows."""
    from moda_bench.bench.runner import Point

    default = Point()
    ok = df[df["status"] == schema.OK]
    plan = {}
    for pass_, grp in ok.groupby("pass", sort=False):
        points = []
        for _, r in grp.iterrows():
            def num(col):
                return int(float(r[col])) if pd.notna(r[col]) else getattr(default, col)
            p = Point(T=num("T"), G=num("G"), Hk=num("Hk"), L=num("L"), B=num("B"), d=num("d"), C=num("C"),
                      dtype=_canon(r["dtype"]) or default.dtype)
            if p not in points:
                points.append(p)
        providers = list(dict.fromkeys(str(p) for p in grp["provider"]))
        plan[str(pass_)] = (points, providers)
    return plan


def run_current(baseline_df: pd.DataFrame, out_csv: Path, *, use_tuned: bool, warmup_ms: float,
                rep_ms: float, log: Callable[[str], None] = print) -> None:
    """Re-run the baseline's points and providers on this GPU into out_csv (replaced)."""
    from moda_bench.bench.runner import run_sweep

    plan = points_from_baseline(baseline_df)
    out_csv = Path(out_csv)
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".gate-", suffix=".csv", dir=out_csv.parent)
    os.close(fd)
    os.unlink(tmp)  # run_sweep appends: start from no file
    try:
        for pass_, (points, providers) in plan.items():
            log(f"gate --run: {pass_}: {len(points)} point(s) x {len(providers)} provider(s) "
                          f"({', '.join(providers)})")
            run_sweep(points, providers, pass_, Path(tmp), sweep_name="gate", use_tuned=use_tuned,
                      warmup_ms=warmup_ms, rep_ms=rep_ms)
        if not Path(tmp).exists():
            raise GateInputError("the gate run wrote no rows")
        os.replace(tmp, out_csv)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
