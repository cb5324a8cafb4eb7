"""The one reader and writer of result CSVs (schema: `moda_bench.schema`).

Every consumer (report, gate, ablate, the pools' merge) reads through `read_csv` /
`read_results`, so one row key (`schema.ROW_KEY`), one notion of "newest row" and one set of
messages hold everywhere:

- a file whose header lacks the schema's required columns is not a sweep CSV: `read_results`
  skips it with a one-line warning naming it (a folder may hold other tables), `read_csv`
  raises `ResultsError`;
- a malformed row (wrong number of fields, or a last line cut off mid-write) is skipped with a
  warning naming the file and line;
- a non-numeric value in a numeric column is a `ResultsError` naming file, line and column.

`read_tuning` reads the tuner's CSV summaries (`schema.TUNE_COLUMNS`), which `read_results`
skips as not being sweep files; `read_models` the model-step files of `moda-bench model`
(`schema.MODEL_COLUMNS`), which `read_results` passes over silently.

Rows of provider `moda` from before `moda` became the dispatcher (`moda_attention(impl="auto")`)
timed the Triton kernel: a training row whose impl_detail starts with the Triton provider's
"moda_attention " (the dispatcher's start with "auto") reads as provider `moda-triton`, so a
report or gate baseline keeps meaning the kernel it measured (`LEGACY_MODA`).

Columns added to the schema later (older files lack them) are filled with empty values, so
committed results stay readable; a configuration column of the row key added later
(`schema.CONFIG_DEFAULTS`: depth_grad, Tq, S) reads as the value every older row had.

Writes are appends of one row (`append_row`, header once) or whole files through a temporary
file, an fsync and a rename (`write_csv_atomic`); the rows of one point go in one `write`
(`append_rows`, SIGINT/SIGTERM held off meanwhile), so a killed run leaves whole points, at worst
a cut last line (skipped on reading, dropped by a resume: `bench.runstate`). JSON records
(run.json) go through `write_json_atomic`.
"""
from __future__ import annotations

import contextlib
import csv
import io
import os
import signal
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Callable, Iterable, Optional

from moda_bench import schema

Warn = Callable[[str], None]


# (provider the legacy `moda` rows read as, the impl_detail prefix that marks them): module docstring
LEGACY_MODA = ("moda-triton", "moda_attention ")


class ResultsError(ValueError):
    """A results file that cannot be used; the message is one line naming file (and row/column)."""


class NotResultsFile(ResultsError):
    """A CSV that is not a moda-bench results file (its header lacks required columns)."""


def default_warn(message: str) -> None:
    warnings.warn(message, stacklevel=3)


def _split_rows(text: str, display: str, warn: Warn) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """Header and (line number, fields) of every well-formed data row; malformed rows warned."""
    cut_last = bool(text) and not text.endswith("\n")
    lines = text.splitlines()
    if not lines or not lines[0].strip():
        raise ResultsError(f"{display}: empty file (no CSV header)")
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader)
        rows = []
        for fields in reader:
            rows.append((reader.line_num, fields))
    except csv.Error as exc:
        raise ResultsError(f"{display}: not a readable CSV ({exc})") from None
    good = []
    for i, (line, fields) in enumerate(rows):
        if not fields or all(not f.strip() for f in fields):
            continue
        last = i == len(rows) - 1
        if last and cut_last:
            warn(f"{display}: line {line} skipped: cut off mid-row (no newline at end of file)")
            continue
        if len(fields) != len(header):
            warn(f"{display}: line {line} skipped: {len(fields)} fields, the header has {len(header)}")
            continue
        good.append((line, fields))
    return header, good


def read_csv(path, *, display: Optional[str] = None, warn: Warn = default_warn):
    """One results CSV as a DataFrame: every schema column (missing optional ones empty), config
    and measure columns numeric, the rest text; plus `_file` and `_line` (its line number)."""
    import pandas as pd

    path = Path(path)
    display = display or str(path)
    if not path.is_file():
        raise ResultsError(f"{display}: file not found")
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise ResultsError(f"{display}: not a text CSV") from None
    header, rows = _split_rows(text, display, warn)
    missing = [c for c in schema.REQUIRED_COLUMNS if c not in header]
    if missing:
        raise NotResultsFile(f"{display}: not a moda-bench results CSV (missing column(s) {', '.join(missing)})")
    df = pd.DataFrame([f for _, f in rows], columns=header, dtype=str)
    for c in schema.COLUMNS:
        if c not in df.columns:
            df[c] = ""
    df["timer"] = df["timer"].where(df["timer"].str.strip() != "", schema.DEFAULT_TIMER)
    legacy = (df["provider"] == "moda") & df["pass"].isin(schema.TRAIN_PASSES) \
        & df["impl_detail"].str.startswith(LEGACY_MODA[1])
    df.loc[legacy, "provider"] = LEGACY_MODA[0]
    for c, default in schema.CONFIG_DEFAULTS.items():   # configuration columns added later
        df[c] = df[c].where(df[c].astype(str).str.strip() != "", str(default))
    for c in schema.NUMERIC_COLUMNS:
        text_col = df[c].astype(str).str.strip()
        num = pd.to_numeric(text_col.where(text_col != "", None), errors="coerce")
        bad = num.isna() & (text_col != "") & (text_col.str.lower() != "nan")
        if bad.any():
            i = int(bad.to_numpy().nonzero()[0][0])
            raise ResultsError(f"{display}: line {rows[i][0]}: non-numeric value {text_col.iloc[i]!r} in column {c}")
        df[c] = num.astype(float)
    extra = [c for c in df.columns if c not in schema.COLUMNS]
    df = df[schema.COLUMNS + extra]
    df["_file"] = display
    df["_line"] = [line for line, _ in rows]
    return df


def find_csvs(paths: Iterable, exclude: Optional[Path] = None) -> list[tuple[Path, str]]:
    """(path, display name) of the CSVs named: files as given, folders searched recursively
    (a `reference/` folder, the paper's tables, is left out); `exclude` is never returned."""
    found: dict[Path, str] = {}
    skip = Path(exclude).resolve() if exclude is not None else None
    for item in paths:
        item = Path(item)
        if not item.exists():
            raise ResultsError(f"{item}: no such file or directory")
        if item.is_file():
            candidates, base = [item], item.parent
        else:
            candidates = sorted(p for p in item.rglob("*.csv")
                                if "reference" not in p.relative_to(item).parts[:-1])
            base = item
        for p in candidates:
            if p.resolve() != skip:
                found.setdefault(p.resolve(), str(p.relative_to(base)) if base != p.parent or item.is_dir() else p.name)
    return sorted(found.items(), key=lambda pn: (pn[1], str(pn[0])))


def read_results(paths: Iterable, *, warn: Warn = default_warn, exclude: Optional[Path] = None):
    """All rows of every results CSV under `paths` (files or folders), in file order. Files that
    are not results CSVs are skipped with a warning; other problems raise ResultsError."""
    import pandas as pd

    frames = []
    for path, display in find_csvs(paths, exclude):
        try:
            frames.append(read_csv(path, display=display, warn=warn))
        except NotResultsFile as exc:
            if not (is_model_file(path) or is_profile_file(path)):   # read_models' / read_profiles' business
                warn(f"skipping {exc}")
    if not frames:
        return empty_frame()
    return pd.concat(frames, ignore_index=True)


def is_tuning_csv(path) -> bool:
    """Whether path's header is a tuner summary's (`schema.TUNE_REQUIRED`); False when unreadable."""
    try:
        with open(path, newline="") as fh:   # the header alone decides
            first = next(csv.reader([fh.readline()]), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return False
    return all(c in first for c in schema.TUNE_REQUIRED)


def read_tuning(paths, *, warn: Warn = default_warn):
    """The tuner's CSV summaries under `paths` (headers with `schema.TUNE_REQUIRED`; other CSVs are
    passed over silently), one row per cache key: the newest by timestamp. Every TUNE_COLUMNS
    column is present (older summaries' missing ones empty; their missing decision reads 'faster
    median' where the stored config's ms is below the default's: that tuner kept any faster
    median, with no margin), TUNE_NUMERIC columns are floats, plus `_file`. An empty frame when
    there is none."""
    import pandas as pd

    frames = []
    for path, display in find_csvs(paths):
        if not is_tuning_csv(path):
            continue  # not a tuning summary: read_results' business
        try:
            header, rows = _split_rows(path.read_text(), display, warn)
        except (OSError, ResultsError, UnicodeDecodeError, csv.Error):
            continue
        if not rows:
            continue
        df = text_frame(header, rows, schema.TUNE_COLUMNS, schema.TUNE_NUMERIC)
        derived = (df["tuned_ms"] < df["default_ms"]).map({True: "faster median", False: "default"})
        df["decision"] = df["decision"].where(df["decision"].str.strip() != "", derived)
        shown = display if len(Path(display).parts) > 1 else f"{path.parent.name}/{display}"  # a run folder given
        frames.append(df[schema.TUNE_COLUMNS].assign(_file=shown))
    if not frames:
        return pd.DataFrame(columns=schema.TUNE_COLUMNS + ["_file"])
    df = pd.concat(frames, ignore_index=True)
    ts = pd.to_datetime(df["timestamp"], utc=True, errors="coerce", format="ISO8601")
    df = df.assign(_ts=ts).sort_values(["_ts", "_file"], kind="stable", na_position="first")
    df = df[~df.duplicated("cache_key", keep="last")].drop(columns="_ts")
    return df.sort_values(["gpu", "T", "G", "L", "d", "dtype"], kind="stable").reset_index(drop=True)


def empty_frame():
    import pandas as pd
    df = pd.DataFrame(columns=schema.COLUMNS + ["_file", "_line"])
    for c in schema.NUMERIC_COLUMNS:
        df[c] = df[c].astype(float)
    return df


def text_frame(header: list[str], rows: list[tuple[int, list[str]]], columns, numeric):
    """A frame of `_split_rows`' rows as text, every one of `columns` present (missing ones empty)
    and the `numeric` ones as floats (blank -> NaN, unparsable -> NaN)."""
    import pandas as pd
    df = pd.DataFrame([f for _, f in rows], columns=header, dtype=str)
    for c in columns:
        if c not in df.columns:
            df[c] = ""
    for c in numeric:
        text = df[c].str.strip()
        df[c] = pd.to_numeric(text.where(text != "", None), errors="coerce")
    return df


def newest(df, key: Optional[list[str]] = None):
    """(newest, superseded): the last-measured row of each row key (by timestamp, then file
    and line), and the rows it replaced."""
    import pandas as pd
    key = key or schema.ROW_KEY
    if df.empty:
        return df, df
    ts = pd.to_datetime(df["timestamp"], utc=True, errors="coerce", format="ISO8601")
    ordered = df.assign(_ts=ts).sort_values(["_ts", "_file", "_line"], kind="stable", na_position="first")
    last = ~ordered.duplicated(key, keep="last")
    order = key + ["_file", "_line"]
    keep = ordered[last].drop(columns="_ts").sort_values(order, kind="stable", na_position="last")
    old = ordered[~last].drop(columns="_ts").sort_values(order, kind="stable", na_position="last")
    return keep.reset_index(drop=True), old.reset_index(drop=True)


def schema_frame(df):
    """Exactly the schema's columns, in order (for writing)."""
    return df[schema.COLUMNS]


def append_row(csv_path, row: dict) -> None:
    """Append one schema row to csv_path (header written once, when the file is new or empty)."""
    import pandas as pd
    csv_path = Path(csv_path)
    new = not csv_path.exists() or csv_path.stat().st_size == 0
    if not new:
        with open(csv_path) as f:
            header = f.readline().strip().split(",")
        if header != schema.COLUMNS:
            raise ResultsError(f"{csv_path}: header differs from the current schema; write to a new file")
    pd.DataFrame([row], columns=schema.COLUMNS).to_csv(csv_path, mode="a", header=new, index=False)


def append_rows(csv_path, rows: list) -> None:
    """Append schema rows to csv_path in one write to a file opened for appending (header first
    when the file is new or empty), SIGINT/SIGTERM held off meanwhile: a process killed or
    interrupted leaves all of them or none, short of a cut line when the disk itself fails."""
    import pandas as pd
    if not rows:
        return
    csv_path = Path(csv_path)
    new = not csv_path.exists() or csv_path.stat().st_size == 0
    if not new:
        with open(csv_path) as f:
            header = f.readline().strip().split(",")
        if header != schema.COLUMNS:
            raise ResultsError(f"{csv_path}: header differs from the current schema; write to a new file")
    data = pd.DataFrame(rows, columns=schema.COLUMNS).to_csv(index=False, header=new).encode()
    with _signals_held():
        fd = os.open(csv_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)


@contextlib.contextmanager
def _signals_held():
    """SIGINT / SIGTERM blocked for the block (main thread; delivered after it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGINT, signal.SIGTERM))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def write_json_atomic(path, data, **dump_kw) -> None:
    """Write `data` as JSON (indent=1 unless dump_kw says otherwise) through a temporary file, an
    fsync and a rename: the file is the old one or the new one, never half of either."""
    import json
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, **dict({"indent": 1, "default": str}, **dump_kw))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_csv_atomic(path, frame, columns=None) -> None:
    """Write frame's `columns` (default: the schema's, `schema_frame`) to path through a temporary
    file and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="") as f:
            (schema_frame(frame) if columns is None else frame[list(columns)]).to_csv(f, index=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def header_of(path) -> list[str]:
    """The header fields of a CSV ([] when unreadable)."""
    try:
        with open(path, newline="") as fh:
            return next(csv.reader([fh.readline()]), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return []


def is_model_file(path) -> bool:
    """Whether a CSV is a `moda-bench model` file (its header has schema.MODEL_REQUIRED)."""
    first = header_of(path)
    return bool(first) and all(c in first for c in schema.MODEL_REQUIRED)


def is_profile_file(path) -> bool:
    """Whether a CSV is a `moda-bench model --profile` file (its header has schema.PROFILE_REQUIRED)."""
    first = header_of(path)
    return bool(first) and all(c in first for c in schema.PROFILE_REQUIRED)


def read_profiles(paths, *, warn: Warn = default_warn):
    """The `moda-bench model --profile` rows under `paths` (headers with schema.PROFILE_REQUIRED;
    other CSVs passed over), ms and share as floats, plus `_file`: of each profiled step
    (schema.PROFILE_RUN_KEY) only the newest run's rows, so a rerun appended to a file replaces
    the earlier one instead of adding to it."""
    import pandas as pd
    frames = []
    for path, display in find_csvs(paths):
        first = header_of(path)
        if not first or not all(c in first for c in schema.PROFILE_REQUIRED):
            continue
        header, rows = _split_rows(path.read_text(), display, warn)
        df = text_frame(header, rows, schema.PROFILE_COLUMNS, ("ms", "share", "layers", "depth_grad", "compiled"))
        frames.append(df[schema.PROFILE_COLUMNS].assign(_file=display))
    if not frames:
        return pd.DataFrame(columns=schema.PROFILE_COLUMNS + ["_file"])
    df = pd.concat(frames, ignore_index=True)
    ts = pd.to_datetime(df["timestamp"], utc=True, errors="coerce", format="ISO8601")
    run = df[schema.PROFILE_RUN_KEY].astype(str).agg("|".join, axis=1)
    latest = ts.groupby(run).transform("max")
    return df[latest.isna() | (ts == latest)].reset_index(drop=True)


def read_models(paths, *, warn: Warn = default_warn):
    """Every `moda-bench model` row under `paths` (files or folders; other CSVs passed over
    silently): all schema.MODEL_COLUMNS (missing ones empty), MODEL_NUMERIC as floats, plus
    `_file`; the newest row of each schema.MODEL_KEY kept. An empty frame when there is none."""
    import pandas as pd

    frames = []
    for path, display in find_csvs(paths):
        if not is_model_file(path):
            continue
        header, rows = _split_rows(path.read_text(), display, warn)
        if not rows:
            continue
        df = text_frame(header, rows, schema.MODEL_COLUMNS, schema.MODEL_NUMERIC)
        frames.append(df[schema.MODEL_COLUMNS].assign(_file=display, _line=[line for line, _ in rows]))
    if not frames:
        return pd.DataFrame(columns=schema.MODEL_COLUMNS + ["_file", "_line"])
    df = pd.concat(frames, ignore_index=True)
    keep, _ = newest(df.fillna({c: "" for c in ("gpu", "model", "dtype")}), schema.MODEL_KEY)
    return keep


def read_model_rows(path, *, warn: Warn = default_warn):
    """Every row of one `moda-bench model` CSV as text, superseded ones included and every
    schema.MODEL_COLUMNS present (missing ones empty): what a rewrite of the file in place keeps."""
    path = Path(path)
    header, rows = _split_rows(path.read_text(), str(path), warn)
    return text_frame(header, rows, schema.MODEL_COLUMNS, ())


def append_model_row(csv_path, row: dict) -> None:
    """Append one model row (schema.MODEL_COLUMNS) to csv_path, header written once."""
    import pandas as pd
    csv_path = Path(csv_path)
    new = not csv_path.exists() or csv_path.stat().st_size == 0
    if not new and header_of(csv_path) != schema.MODEL_COLUMNS:
        raise ResultsError(f"{csv_path}: header differs from the model schema; write to a new file")
    pd.DataFrame([row], columns=schema.MODEL_COLUMNS).to_csv(csv_path, mode="a", header=new, index=False)
