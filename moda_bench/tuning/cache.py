"""The tuning cache: one JSON file of tuned configs, and the explicit switch (`use`, `using`)
that makes `moda_attention` consult it.

File: {"schema_version": N, "entries": {key: entry}}. The key holds the GPU name, triton
version, dtype, d, G, L and a power-of-two bucket of T (T in (2^(k-1), 2^k] -> 2^k), so a T
sweep re-uses one tuning per octave instead of tuning every length (B and Hk only change the
grid size and are not part of the key). Entries store the winning config, default vs tuned ms
(fwd+bwd), the date and the tuning wall time. Location: explicit path, else
$MODA_BENCH_TUNING_CACHE, else the platform cache dir (Linux $XDG_CACHE_HOME or ~/.cache,
macOS ~/Library/Caches, Windows %LOCALAPPDATA%) + moda-bench/tuning.json. A corrupt file, a
different schema version or an entry whose config no longer validates is ignored with a
warning. Writes are atomic (temporary file + os.replace).

Nothing is consulted implicitly: `load(path)` reads a cache into a `TuningCache`, a config
source (shape, dtype) -> MoDAConfig | None; `use()` installs one as the source of
`resolve_config` (so `moda_attention` calls without `config=` get tuned configs), `using(enabled)`
does that for a `with` block and restores the previous source, `stop_using()` goes back to the
heuristic defaults. $MODA_BENCH_NO_TUNING=1 turns `use` / `using` into heuristic defaults.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import sys
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional, Union

import triton

from moda_bench.ops.moda.config import MoDAConfig, config_source, default_config, set_config_source
from moda_bench.ops.moda.validate import MoDAShape
from moda_bench.tuning.space import config_problems, dtype_name

SCHEMA_VERSION = 1
ENV_CACHE = "MODA_BENCH_TUNING_CACHE"
ENV_NO_TUNING = "MODA_BENCH_NO_TUNING"


# ----------------------------------------------------------------------------- keys and paths

_gpu_names: dict[int, str] = {}
_cuda_ok: Optional[bool] = None


def _current_device() -> int:
    """Current CUDA device index, -1 without CUDA (availability checked once)."""
    global _cuda_ok
    try:
        import torch
        if _cuda_ok is None:
            _cuda_ok = bool(torch.cuda.is_available())
        return torch.cuda.current_device() if _cuda_ok else -1
    except Exception:  # pragma: no cover - a broken driver means no GPU to key on
        return -1


def current_gpu_name() -> str:
    """Name of the current CUDA device (memoised per index), 'cpu' without CUDA."""
    idx = _current_device()
    if idx < 0:
        return "cpu"
    name = _gpu_names.get(idx)
    if name is None:
        import torch
        name = _gpu_names[idx] = torch.cuda.get_device_name(idx)
    return name


def t_bucket(T: int) -> int:
    """Power-of-two bucket of a sequence length: the smallest 2^k >= T."""
    return 1 << (max(int(T), 1) - 1).bit_length()



def cache_key(shape: MoDAShape, dtype, *, gpu: Optional[str] = None, triton_version: Optional[str] = None) -> str:
    """'<gpu>|triton <ver>|<dtype>|d<d>|G<G>|L<L>|T<=<2^k>' (T bucketed to a power of two)."""
    gpu = current_gpu_name() if gpu is None else gpu
    ver = triton.__version__ if triton_version is None else triton_version
    return f"{gpu}|triton {ver}|{dtype_name(dtype)}|d{shape.d}|G{shape.G}|L{shape.L}|T<={t_bucket(shape.T)}"


def default_cache_path() -> Path:
    """Platform cache location of tuning.json (ignores the environment override)."""
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    elif sys.platform.startswith("win"):
        base = Path(os.environ.get("LOCALAPPDATA") or (Path.home() / "AppData" / "Local"))
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or (Path.home() / ".cache"))
    return base / "moda-bench" / "tuning.json"


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


def atomic_write_json(path: Path, data: dict) -> None:
    """Write JSON to a temporary file beside `path`, fsync, then os.replace (never half-written)."""
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


def cache_entry(result, gpu: Optional[str] = None, triton_version: Optional[str] = None) -> dict:
    """The cache entry of a `tuner.TuneResult`: its config, default and tuned ms, and where,
    when and how long it was tuned."""
    s = result.shape
    return {
        "gpu": gpu or current_gpu_name(), "triton_version": triton_version or triton.__version__,
        "dtype": result.dtype, "d": s.d, "G": s.G, "L": s.L, "T_bucket": t_bucket(s.T),
        "tuned_shape": {"B": s.B, "T": s.T, "Hq": s.Hq, "Hk": s.Hk, "d": s.d, "L": s.L},
        "config": result.config.to_dict(), "default_config": default_config(s, result.dtype).to_dict(),
        "pass": "fwdbwd", "default_ms": result.default_ms, "tuned_ms": result.tuned_ms,
        "speedup": result.speedup,
        "kernels": {k: ks.summary() for k, ks in result.kernels.items()},
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "tuning_wall_s": round(result.wall_s, 3),
    }


def save_result(result, path=None) -> tuple[str, Path]:
    """Persist one `tuner.TuneResult` under its cache key, merged into the cache file (re-read
    just before writing) atomically; returns (key, path)."""
    key = cache_key(result.shape, result.dtype)
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

    The file is re-parsed only when it changes (inode, mtime, size), so a lookup per launch
    costs one stat(); answers are memoised per (shape, dtype, device). `path` None: the file
    $MODA_BENCH_TUNING_CACHE names, else the platform default, looked up at every call (the
    variable may change later).
    """

    def __init__(self, path=None):
        self.fixed: Optional[Path] = Path(path).expanduser() if path else None
        self._file: Optional[Path] = None
        self._stamp = None
        self._entries: dict = {}
        self._configs: dict[tuple, Optional[MoDAConfig]] = {}

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

    def config(self, shape: MoDAShape, dtype) -> Optional[MoDAConfig]:
        entries = self.entries()
        if not entries:
            return None
        memo = (shape, dtype, _current_device())
        if memo not in self._configs:
            key = cache_key(shape, dtype)
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
    $MODA_BENCH_TUNING_CACHE, else the platform default). Returns the cache installed; with
    $MODA_BENCH_NO_TUNING=1 it installs none, clears the source (heuristic defaults) and
    returns None."""
    if _disabled():
        set_config_source(None)
        return None
    cache = path_or_cache if isinstance(path_or_cache, TuningCache) else TuningCache(path_or_cache)
    set_config_source(cache)
    return cache


def stop_using() -> None:
    """Back to the heuristic default configs: remove the installed config source."""
    set_config_source(None)


@contextmanager
def using(enabled: bool = True, path_or_cache=None) -> Iterator[Optional[TuningCache]]:
    """Within the block, `use(path_or_cache)` if enabled, else the heuristic defaults; the config
    source installed before is restored on exit. Yields the cache in use (None: defaults)."""
    previous = config_source()
    try:
        if enabled:
            yield use(path_or_cache)
        else:
            stop_using()
            yield None
    finally:
        set_config_source(previous)
