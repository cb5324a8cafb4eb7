"""The one CSV schema every sweep, ablation, tuning and gate file uses (long format, one row
per (provider, configuration, pass)).

`CONFIG_COLUMNS` + provider + pass is the row key: define it here once, use it everywhere.
"""
from __future__ import annotations

import datetime as _dt
import functools
import os
import platform
import subprocess

CONFIG_COLUMNS = ["T", "G", "Hq", "Hk", "L", "B", "d", "C", "dtype"]
KEY_COLUMNS = ["provider", "pass"] + CONFIG_COLUMNS
MEASURE_COLUMNS = [
    "median_ms", "p20_ms", "p80_ms", "tflops", "extra_time_pct", "ratio_to_fa2",
    "depth_utilization", "peak_mem_mb", "max_rel_err",
]
META_COLUMNS = ["gpu", "gpu_index", "torch_version", "triton_version", "git_commit", "timestamp"]
COLUMNS = (
    ["sweep", "provider", "impl_detail", "pass"] + CONFIG_COLUMNS + MEASURE_COLUMNS
    + ["status", "reason", "config"] + META_COLUMNS
)
# status values
OK, SKIPPED, OOM, ERROR = "ok", "skipped", "oom", "error"


def seq_flops(B: int, Hq: int, T: int, d: int) -> float:
    """Causal sequence FLOPs of one forward (spec section 2)."""
    return 4.0 * B * Hq * d * T * (T + 1) / 2


def depth_flops(B: int, Hq: int, T: int, d: int, L: int) -> float:
    """Depth FLOPs of one forward (spec section 2)."""
    return 4.0 * B * Hq * d * T * L


def pass_flops(pass_: str, B: int, Hq: int, T: int, d: int, L: int) -> float:
    """Useful FLOPs for fwd / bwd (2.5x fwd) / fwdbwd (3.5x fwd)."""
    f = seq_flops(B, Hq, T, d) + depth_flops(B, Hq, T, d, L)
    return f * {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}[pass_]


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """Short commit of the source tree (with -dirty), $MODA_BENCH_GIT_COMMIT where the tree has
    no .git (a copied checkout), else 'unknown'."""
    if os.environ.get("MODA_BENCH_GIT_COMMIT"):
        return os.environ["MODA_BENCH_GIT_COMMIT"]
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return (sha + ("-dirty" if dirty else "")) if sha else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run_metadata(device_index: int | None = None) -> dict:
    """GPU name, versions, commit and an ISO timestamp for every row of a run."""
    import torch
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:  # pragma: no cover
        triton_version = "none"
    if torch.cuda.is_available():
        idx = torch.cuda.current_device() if device_index is None else device_index
        gpu = torch.cuda.get_device_name(idx)
    else:
        idx, gpu = -1, f"cpu ({platform.processor() or platform.machine()})"
    return {
        "gpu": gpu,
        "gpu_index": idx,
        "torch_version": torch.__version__,
        "triton_version": triton_version,
        "git_commit": git_commit(),
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
