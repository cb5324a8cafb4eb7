"""The tuning cache: one JSON file of tuned configs, and the explicit switch (`use`, `using`)
that makes `moda_attention` consult it.

File: {"schema_version": N, "entries": {key: entry}}. The key holds the GPU name, triton
version, dtype, d, G, L and a power-of-two bucket of T (T in (2^(k-1), 2^k] -> 2^k), so a T
sweep re-uses one tuning per octave instead of tuning every length (B and Hk only change the
grid size and are not part of the key). A look-up takes its own bucket's entry or nothing: no
entry serves another bucket. Entries store the config to use, the decision ('tuned': the
searched candidate beat the default by more than the noise; 'default': it did not, and the
default config is stored), both fwd+bwd times, the candidate/default ratio with its 95%
interval from interleaved rounds, the date and the tuning wall time (entries written before
the decision existed have no 'decision' field and are used as they are).

Location: explicit path, else $MODA_BENCH_TUNING_CACHE, else the platform cache dir (Linux
$XDG_CACHE_HOME or ~/.cache, macOS ~/Library/Caches, Windows %LOCALAPPDATA%) +
moda-bench/tuning.json. A corrupt file, a different schema version or an entry whose config no
longer validates is ignored with a warning. Writes are atomic (temporary file + os.replace).

Nothing is consulted implicitly: `load(path)` reads a cache into a `TuningCache`, a config
source (shape, dtype) -> MoDAConfig | None; `use()` installs one as the source of
`resolve_config` (so `moda_attention` calls without `config=` get tuned configs), `using(enabled)`
does that for a `with` block and restores the previous source, `stop_using()` goes back to the
state at import (no user cache; the package's shipped configs for this GPU, else the heuristic
defaults). `using(False)` and $MODA_BENCH_NO_TUNING=1 (for `use` / `using`) mean heuristic
defaults only, shipped configs included.

An installed cache answers `resolve_config` through its `stamp()`: the file (and the variable
naming it) is looked at no more often than every `recheck_s` seconds (RECHECK_S = 1 s), and at
once after a write through this module or `refresh()`, so a launch costs no file-system call; a
change made by another process is seen within `recheck_s`.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import sys
import tempfile
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional, Union

import triton

from moda_bench import schema
from moda_bench.kernels.moda.config import (
    ENV_NO_TUNING,
    MoDAConfig,
    config_source,
    current_device_index,
    current_gpu_name,
    default_config,
    dtype_name,
    op_prefix,
    set_config_source,
    set_shipped,
    shipped_enabled,
    t_bucket,
)
from moda_bench.kernels.moda.validate import MoDAShape
from moda_bench.tuning.space import config_problems

SCHEMA_VERSION = 1
ENV_CACHE = "MODA_BENCH_TUNING_CACHE"
RECHECK_S = 1.0  # how often an installed cache looks at its file
DECISIONS = ("tuned", "default")

__all__ = ["ENV_CACHE", "ENV_NO_TUNING", "SCHEMA_VERSION", "RECHECK_S", "DECISIONS", "TuningCache",
           "atomic_write_json", "cache_entry", "cache_key", "current_gpu_name", "default_cache_path", "entry_config",
           "load", "read_entries", "resolve_cache_path", "save_result", "stop_using", "t_bucket", "use", "using"]


# ----------------------------------------------------------------------------- keys and paths

def cache_key(shape: MoDAShape, dtype, *, gpu: Optional[str] = None, triton_version: Optional[str] = None,
              op: str = "moda") -> str:
    """'[<op>|]<gpu>|triton <ver>|<dtype>|d<d>|G<G>|L<L>|T<=<2^k>' (T bucketed to a power of two;
    the operator prefix for ops other than moda, `config.OPS`)."""
    gpu = current_gpu_name() if gpu is None else gpu
    ver = triton.__version__ if triton_version is None else triton_version
    return (f"{op_prefix(op)}{gpu}|triton {ver}|{dtype_name(dtype)}|d{shape.d}|G{shape.G}|L{shape.L}"
            f"|T<={t_bucket(shape.T)}")


def default_cache_path() -> Path:
    """Platform cache location of tuning.json (ignores the environment override)."""
    return schema.user_cache_dir() / "tuning.json"


def resolve_cache_path(path=None) -> Path:
    """Explicit path, else $MODA_BENCH_TUNING_CACHE, else `default_cache_path()`."""
    if path:
        return Path(path).expanduser()
    env = os.environ.get(ENV_CACHE)
    return Path(env).expanduser() if env else default_cache_path()


_ENV_INPUTS = (ENV_CACHE, "XDG_CACHE_HOME", "LOCALAPPDATA", "HOME", "USERPROFILE")
_resolved: dict[tuple, Path] = {}


def _cache_path_now() -> Path:
    """resolve_cache_path(None), memoised on the environment variables it reads (hot path)."""
    key = (sys.platform,) + tuple(os.environ.get(v) for v in _ENV_INPUTS)
    p = _resolved.get(key)
    if p is None:
        p = _resolved[key] = resolve_cache_path(None)
    return p


# ----------------------------------------------------------------------------- read / write

def read_entries(path=None) -> dict:
    """Entries {key: entry} of the cache file at `path` (None: the environment / platform
    default); {} if it is missing, and with a warning if it is corrupt or of another schema."""
    return _read(path)


def _read(path=None) -> dict:
    """Entries {key: entry} of the cache file; {} (with a warning) if corrupt or of another schema."""
    p = resolve_cache_path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        warnings.warn(f"moda-bench tuning cache {p} unreadable ({exc}); ignoring it", stacklevel=2)
        return {}
    return _parse(text, p)


def _parse(text: str, p: Path) -> dict:
    try:
        data = json.loads(text)
    except ValueError as exc:
        warnings.warn(f"moda-bench tuning cache {p} is corrupt ({exc}); ignoring it", stacklevel=3)
        return {}
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
        warnings.warn(f"moda-bench tuning cache {p} has no 'entries' table; ignoring it", stacklevel=3)
        return {}
    if data.get("schema_version") != SCHEMA_VERSION:
        warnings.warn(f"moda-bench tuning cache {p} has schema version {data.get('schema_version')!r}, "
                      f"expected {SCHEMA_VERSION}; ignoring it (re-run `moda-bench tune`)", stacklevel=3)
        return {}
    return data["entries"]


_writes = 0  # writes through atomic_write_json in this process: installed caches look again


def atomic_write_json(path: Path, data: dict) -> None:
    """Write JSON to a temporary file beside `path`, fsync, then os.replace (never half-written)."""
    global _writes
    _writes += 1
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _num(x) -> Optional[float]:
    """A float for JSON: NaN and inf become None (strict JSON has neither)."""
    return float(x) if x is not None and math.isfinite(x) else None


def cache_entry(result, gpu: Optional[str] = None, triton_version: Optional[str] = None) -> dict:
    """The cache entry of a `tuner.TuneResult`: the config to use and the decision, the
    candidate the search found (null when it was the default), default, candidate and used ms,
    the candidate/default ratio with its 95% interval, and where, when and how long it was tuned."""
    s = result.shape
    cand = result.candidate
    return {
        "op": getattr(result, "op", "moda"),
        "gpu": gpu or current_gpu_name(), "triton_version": triton_version or triton.__version__,
        "dtype": result.dtype, "d": s.d, "G": s.G, "L": s.L, "T_bucket": t_bucket(s.T),
        "tuned_shape": {"B": s.B, "T": s.T, "Hq": s.Hq, "Hk": s.Hk, "d": s.d, "L": s.L},
        "config": result.config.to_dict(), "default_config": default_config(s, result.dtype).to_dict(),
        "decision": result.decision, "candidate_config": cand.to_dict() if cand is not None else None,
        "pass": "fwdbwd", "default_ms": _num(result.default_ms), "tuned_ms": _num(result.tuned_ms),
        "candidate_ms": _num(result.candidate_ms), "speedup": _num(result.speedup),
        "ratio": _num(result.ratio), "ratio_lo": _num(result.ratio_lo), "ratio_hi": _num(result.ratio_hi),
        "min_gain": result.min_gain, "compare_rounds": result.compare_rounds,
        "kernels": {k: ks.summary() for k, ks in result.kernels.items()},
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "tuning_wall_s": round(result.wall_s, 3),
    }


def save_result(result, path=None) -> tuple[str, Path]:
    """Persist one `tuner.TuneResult` under its cache key, merged into the cache file (re-read
    just before writing) atomically; returns (key, path)."""
    key = cache_key(result.shape, result.dtype, op=getattr(result, "op", "moda"))
    p = resolve_cache_path(path)
    entries = _read(p)
    entries[key] = cache_entry(result)
    atomic_write_json(p, {"schema_version": SCHEMA_VERSION, "entries": entries})
    return key, p


def entry_config(entry: dict, G: int, key: str = "") -> Optional[MoDAConfig]:
    """The entry's MoDAConfig, or None with a warning if it no longer validates (stale)."""
    try:
        cfg = MoDAConfig.from_dict(entry["config"])
        probs = config_problems(cfg, G)
    except Exception as exc:
        probs = [f"{type(exc).__name__}: {exc}"]
    if probs:
        warnings.warn(f"moda-bench tuning cache entry {key!r} is stale ({probs[0]}); using the default config",
                      stacklevel=3)
        return None
    return cfg


# ----------------------------------------------------------------------------- the cache as a config source

class TuningCache:
    """A tuning cache file as a config source: `cache(shape, dtype)` (or `.config`) is the tuned
    MoDAConfig of that shape and dtype on the current GPU, or None.

    `entries()` looks at the file at every call and re-parses it only when it changed (inode,
    mtime, size); answers are memoised per (shape, dtype, device). `path` None: the file
    $MODA_BENCH_TUNING_CACHE names, else the platform default (the variable may change later).
    `stamp()` is what `resolve_config` checks per launch: it looks at the file at most every
    `recheck_s` seconds (and at once after `refresh()` or a write through this module).
    """

    def __init__(self, path=None, recheck_s: float = RECHECK_S):
        self.fixed: Optional[Path] = Path(path).expanduser() if path else None
        self.recheck_s = recheck_s
        self._file: Optional[Path] = None
        self._stamp = None
        self._entries: dict = {}
        self._configs: dict[tuple, Optional[MoDAConfig]] = {}
        self._last_check = -math.inf
        self._writes_seen = -1

    @property
    def path(self) -> Path:
        return _cache_path_now() if self.fixed is None else self.fixed

    def entries(self) -> dict:
        """{key: entry} of the file as it is now ({} if missing, corrupt or of another schema)."""
        path = self.path
        try:
            st = os.stat(path)
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        if path != self._file or stamp != self._stamp:
            self._file, self._stamp, self._configs = path, stamp, {}
            self._entries = _read(path) if stamp is not None else {}
        return self._entries

    def stamp(self) -> tuple:
        """(file, inode/mtime/size) as last seen; the file is looked at again when `recheck_s`
        has passed since the last look, after `refresh()`, or after a write in this process."""
        now = time.monotonic()
        if now - self._last_check >= self.recheck_s or self._writes_seen != _writes:
            self._last_check, self._writes_seen = now, _writes
            self.entries()
        return self._file, self._stamp

    def refresh(self) -> None:
        """Look at the file (and $MODA_BENCH_TUNING_CACHE) again at the next `stamp()`."""
        self._last_check = -math.inf

    def config(self, shape: MoDAShape, dtype, op: str = "moda") -> Optional[MoDAConfig]:
        """The entry's config for (shape, dtype) of operator `op` on the current GPU, or None."""
        entries = self.entries()
        if not entries:
            return None
        memo = (shape, dtype, current_device_index(), op)
        if memo not in self._configs:
            key = cache_key(shape, dtype, op=op)
            entry = entries.get(key)
            self._configs[memo] = entry_config(entry, shape.G, key) if isinstance(entry, dict) else None
        return self._configs[memo]

    __call__ = config


def load(path=None) -> TuningCache:
    """Read the tuning cache at `path` (None: $MODA_BENCH_TUNING_CACHE, else the platform
    default); a corrupt file warns here. Nothing is installed: pass it to `use` for that."""
    cache = TuningCache(path)
    cache.entries()
    return cache


def _disabled() -> bool:
    return os.environ.get(ENV_NO_TUNING, "0") not in ("", "0")


def use(path_or_cache: Union[None, str, os.PathLike, TuningCache] = None) -> Optional[TuningCache]:
    """Make `moda_attention` (through `resolve_config`) consult a tuning cache from now on,
    replacing any config source installed before: a `TuningCache`, or the file at a path (None:
    $MODA_BENCH_TUNING_CACHE, else the platform default); shapes it has no entry for get the
    shipped configs of this GPU, else the heuristic default. Returns the cache installed; with
    $MODA_BENCH_NO_TUNING=1 it installs none and turns the shipped configs off (heuristic
    defaults only) and returns None."""
    if _disabled():
        set_config_source(None)
        set_shipped(False)
        return None
    cache = path_or_cache if isinstance(path_or_cache, TuningCache) else TuningCache(path_or_cache)
    set_config_source(cache)
    set_shipped(True)
    return cache


def stop_using() -> None:
    """Back to the state at import: no user cache; this GPU's shipped configs, else the
    heuristic defaults."""
    set_config_source(None)
    set_shipped(True)


@contextmanager
def using(enabled: bool = True, path_or_cache=None) -> Iterator[Optional[TuningCache]]:
    """Within the block, `use(path_or_cache)` if enabled, else the heuristic defaults only (no
    user cache, no shipped configs); the config source and shipped setting of before are
    restored on exit. Yields the cache in use (None: defaults)."""
    previous, shipped = config_source(), shipped_enabled()
    try:
        if enabled:
            yield use(path_or_cache)
        else:
            set_config_source(None)
            set_shipped(False)
            yield None
    finally:
        set_config_source(previous)
        set_shipped(shipped)
