"""The vocabulary every layer shares: the CSV schema (long format, one row per (sweep, GPU,
provider, configuration, pass, timer)), its row key, the sweep axes with their paper values and
base point, the pass names, FLOP counts and run metadata. The byte and FLOP model behind the
floor columns is `moda_bench.floor`.

`ROW_KEY` (sweep + gpu + provider + pass + timer + CONFIG_COLUMNS) is the row key of every
results file; `moda_bench.results` is the one reader that uses it.
"""
from __future__ import annotations

import datetime as _dt
import functools
import os
import platform
import subprocess
import sys
from pathlib import Path

# depth_grad: 1 = the backward writes depth K/V gradients, 0 = depth detached;
# Tq: new tokens per sequence of a decode row (0 for training passes, where every position is a
# query); S: earlier source layers of a Depth-Attention row (0 elsewhere)
CONFIG_COLUMNS = ["T", "G", "Hq", "Hk", "L", "B", "d", "C", "dtype", "depth_grad", "Tq", "S"]
# what a row of a file written before a configuration column existed had
CONFIG_DEFAULTS = {"depth_grad": 1, "Tq": 0, "S": 0}
KEY_COLUMNS = ["provider", "pass", "timer"] + CONFIG_COLUMNS
# the paper's extra-time columns -> the provider whose time is F in (M - F) / M (`fill_extra_time`)
EXTRA_TIME_PAPER = {"extra_time_paper_pct": "fa2-triton", "extra_time_paper_fa2_pct": "fa2",
                    "extra_time_paper_fa4_pct": "fa4"}
MEASURE_COLUMNS = [
    "median_ms", "p20_ms", "p80_ms", "tflops", "extra_time_pct", "ratio_to_fa2",
    "depth_utilization", "peak_mem_mb", "max_rel_err",
    # paired 95% intervals of the ratios, the ratio to the fastest sequence-only
    # attention of the point, sample count and noise, GPU state sampled while the point ran
    "ratio_to_fa2_lo", "ratio_to_fa2_hi", "ratio_to_best", "ratio_to_best_lo", "ratio_to_best_hi",
    "samples", "noise_pct", "sm_clock_mhz", "sm_clock_min_mhz", "mem_clock_mhz", "power_w", "temp_c",
    # the row's own floor (moda_bench.floor, docs/FLOOR.md): useful FLOPs and minimum HBM bytes of
    # its provider and pass, max(flops / matmul rate, bytes / copy rate) at the run's canary
    # rates, median / floor, and the bytes per second reached (GB/s)
    "flops", "bytes", "floor_ms", "of_floor", "gbps",
    # the forward run twice more on the same inputs (CUDA only; NaN elsewhere): 0 when bitwise
    # equal, else ||b - a|| / ||a|| over the whole output. A race shows here in rows that a
    # prefix accuracy check never reads (as moda-fa4's old in-place merge did: docs/DESIGN.md,
    # "The merge route")
    "repeat_err",
    # the row's own SM clock (median) and power (mean), from the polls taken while its provider's
    # repetitions ran (the columns above are the whole point's); NaN without a poll in them. Two
    # kernels sharing the GPU (moda-overlap) draw more power than one: under the power cap this
    # is where a provider running at lower clocks than its peers shows
    "own_sm_clock_mhz", "own_power_w",
    # times the CUDA caching allocator had to free its cache and retry a cudaMalloc while the
    # point was timed (torch's num_alloc_retries; NaN off CUDA): > 0 when the staged providers'
    # inputs fill the GPU, which slows some providers and not others (enough to change a ratio
    # between providers several-fold); such rows are marked degraded
    "alloc_retries",
    # extra time as the MoDA paper defines it, (M - F) / M x 100 with M this row's median
    # and F the median of a sequence-only baseline at the same point of the same run (the paper's
    # baseline is a Triton FlashAttention-2: our fa2-triton; also against fa2 and fa4). NaN where
    # that baseline has no ok row. `extra_time_pct` above is a different quantity, the OVERHEAD
    # (M / F - 1) x 100 over fa2 (kept under its old name so older files read the same)
    *EXTRA_TIME_PAPER,
]
# the host canary of the process that timed the row (moda_bench.host.host_canary, run once at
# its start; NaN off CUDA): median host microseconds of a bare Triton launch with 30 scalar
# arguments, of one tiny torch op, and of forward + backward through a trivial Python autograd
# Function. An eager row at short T times the host, not the GPU, and the host's speed varies by
# machine start and CPU core (docs/DESIGN.md, "The host path at short T"); these say how fast the
# row's host was
HOST_COLUMNS = ["host_launch_us", "host_op_us", "host_autograd_us"]
MEASURE_COLUMNS += HOST_COLUMNS
# timer: eager | graph; stop_reason: why sampling ended; best_provider: the denominator of
# ratio_to_best; throttle: NVML clock-event reasons seen; health: the run's GPU verdict;
# host_cpus: the CPUs the timing process ran on ('all', or the ids it was pinned to: --pin-cpu)
TEXT_COLUMNS = ["timer", "stop_reason", "best_provider", "throttle", "health", "host_cpus"]
META_COLUMNS = ["gpu", "gpu_index", "torch_version", "triton_version", "git_commit", "timestamp"]
COLUMNS = (
    ["sweep", "provider", "impl_detail", "pass"] + CONFIG_COLUMNS + MEASURE_COLUMNS
    + ["status", "reason", "config"] + TEXT_COLUMNS + META_COLUMNS
)
# the row key: a sweep's row of a GPU, provider, pass, timer and configuration (eager and graph
# rows of one point live side by side; files from before the timer column read as 'eager'; a
# report over folders of several GPUs keeps each GPU's rows)
ROW_KEY = ["sweep", "gpu"] + KEY_COLUMNS
# a results file must have these; columns added later are optional (older files lack them)
# The tuner's CSV summary (`moda-bench tune --out`, one row per tuned shape): the point, the
# default and candidate (search winner) fwd+bwd ms, the stored config's ms, the candidate/default
# ratio with its 95% interval, the margin, the decision ('tuned' | 'default'), the stored config
# and its fields that differ from the shape's default config (tuned_fields). Older summaries lack
# candidate_ms, ratio_lo/hi, min_gain, decision, tuned_fields; TUNE_REQUIRED recognises them.
TUNE_COLUMNS = CONFIG_COLUMNS + ["default_ms", "candidate_ms", "tuned_ms", "ratio", "ratio_lo", "ratio_hi",
                                 "min_gain", "decision", "speedup", "wall_s", "status", "reason", "config",
                                 "cache_key", "tuned_fields"] + META_COLUMNS
TUNE_REQUIRED = ["default_ms", "tuned_ms", "cache_key"]
TUNE_NUMERIC = ["T", "G", "Hq", "Hk", "L", "B", "d", "C", "default_ms", "candidate_ms", "tuned_ms", "ratio",
                "ratio_lo", "ratio_hi", "min_gain", "speedup", "wall_s"]
REQUIRED_COLUMNS = (["sweep", "provider", "pass"] + [c for c in CONFIG_COLUMNS if c not in CONFIG_DEFAULTS]
                    + ["median_ms", "status"]
                    + ["gpu", "torch_version", "triton_version", "git_commit", "timestamp"])
INT_CONFIG_COLUMNS = [c for c in CONFIG_COLUMNS if c != "dtype"]
NUMERIC_COLUMNS = INT_CONFIG_COLUMNS + MEASURE_COLUMNS

# passes: what is timed (training: forward only, backward only, both; decode: one inference step
# of the Tq newest tokens over a KV cache, forward only)
TRAIN_PASSES = ("fwd", "bwd", "fwdbwd")
DECODE_PASS = "decode"
PASSES = TRAIN_PASSES + (DECODE_PASS,)
PASS_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5, "decode": 1.0}   # useful FLOPs relative to the forward

# one-axis sweeps: the paper's values per axis (spec section 4) around the base point.
# C = query chunk rows (MoDA block_m).
# B (batch), S (Depth-Attention sources; an S sweep sets L = S too, so MoDA reads as many depth
# entries) and Tq (decode's new tokens) are ours.
AXIS_VALUES = {
    "T": (4096, 8192, 16384, 32768, 65536),
    "G": (2, 4, 8, 16, 32),
    "L": (64, 128, 256),
    "C": (16, 32, 64, 128),
    "B": (1, 8, 32, 128),
    "S": (1, 2, 4, 8, 16, 47),
    "Tq": (1, 2, 4),
}
AXES = tuple(AXIS_VALUES)
BASE_POINT = {"T": 16384, "G": 8, "Hk": 8, "L": 64, "B": 1, "d": 64, "C": 64, "dtype": "bfloat16",
              "depth_grad": 1, "Tq": 0, "S": 0}


# `moda-bench model` (docs/MODELS.md): one row per (model configuration, variant, mode, compile) of a
# whole decoder step. Its files hold MODEL_COLUMNS, not COLUMNS (the kernel report never reads
# them as sweep rows); `results.read_models` reads them. Modes: a training step (forward,
# backward, AdamW step over grad_accum micro-batches), a prefill, a generation (prompt + new
# tokens through a KV cache). step_ms: median of the mode's wall time (a whole generation for
# 'generate'); tokens_per_s: tokens processed per second (generated tokens for 'generate');
# peak_mem_gb: the CUDA allocator's peak during one step (the variant's second step, so its AdamW
# state exists as in a timed step);
# peak_over_vanilla_gb: that peak minus vanilla's in the same run; depth_kv_gb: seed 004's
# retained depth-KV formula for this shape and the slots the variant keeps (models.flops.depth_slots);
# depth_buffer_gb / depth_grad_buffer_gb: the bytes of the model's depth-KV buffer and of its
# gradient buffer (attached depth) as allocated; model_flops: the step's model FLOPs
# (moda_bench.models.flops: 6 N per trained token + attention and depth terms); mfu:
# model_flops / step time / peak_tflops (the doctor's table number of the GPU); graph_breaks: the
# compiled step's graph breaks (torch._dynamo.explain before timing; blank when not compiled).
MODEL_MODES = ("train", "prefill", "generate")
MODEL_CONFIG_COLUMNS = ["model", "layers", "layers_total", "B", "T", "grad_accum", "new_tokens", "dtype",
                        "depth_grad", "compiled"]
MODEL_MEASURE_COLUMNS = ["step_ms", "step_p20_ms", "step_p80_ms", "ratio_to_vanilla", "ratio_to_vanilla_lo",
                         "ratio_to_vanilla_hi", "tokens_per_s", "peak_mem_gb", "peak_over_vanilla_gb", "depth_kv_gb",
                         "depth_buffer_gb", "depth_grad_buffer_gb", "params",
                         "model_flops", "mfu", "peak_tflops", "samples", "noise_pct", "graph_breaks"]
MODEL_COLUMNS = (["sweep", "provider", "impl_detail", "pass"] + MODEL_CONFIG_COLUMNS + MODEL_MEASURE_COLUMNS
                 + ["status", "reason", "timer", "stop_reason", "health"] + META_COLUMNS)
MODEL_KEY = ["sweep", "gpu", "provider", "pass"] + MODEL_CONFIG_COLUMNS
MODEL_NUMERIC = [c for c in MODEL_CONFIG_COLUMNS if c not in ("model", "dtype")] + MODEL_MEASURE_COLUMNS
MODEL_REQUIRED = ["sweep", "provider", "pass", "model", "step_ms", "model_flops", "status"]
# `moda-bench model --profile`: where one step's time goes, one row per (variant, category):
# the device time (CPU time off CUDA) of the category's kernels in ms and its share of the step's
# total; categories are moda_bench.models.decoder.LABELS, 'optimizer' and 'other'
PROFILE_COLUMNS = (["sweep", "provider", "pass", "model", "layers", "depth_grad", "compiled", "category", "ms",
                    "share", "clock"] + META_COLUMNS)
PROFILE_REQUIRED = ["sweep", "provider", "category", "ms", "share"]
# one profiled step: its rows (a row a category) share these and the timestamp; a rerun supersedes them
PROFILE_RUN_KEY = ["sweep", "gpu", "provider", "pass", "model", "layers", "depth_grad", "compiled"]


def check_pass(pass_: str) -> str:
    """pass_ if it is a pass name, else ValueError listing them."""
    if pass_ not in PASSES:
        raise ValueError(f"pass must be one of {', '.join(PASSES)}, got {pass_!r}")
    return pass_


# dtype spellings accepted on the command line -> the torch dtype name stored in the `dtype` column
DTYPE_ALIASES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
                 "half": "float16", "fp32": "float32", "float32": "float32"}


def dtype_name(text: str) -> str:
    """The `dtype` column's name for a spelling such as 'bf16', else ValueError listing them."""
    name = DTYPE_ALIASES.get(str(text).lower())
    if name is None:
        raise ValueError(f"dtype must be one of bf16, fp16, fp32, got {text!r}")
    return name


DEFAULT_TIMER = "eager"

# status values
OK, SKIPPED, OOM, ERROR = "ok", "skipped", "oom", "error"


def seq_flops(B: int, Hq: int, T: int, d: int) -> float:
    """Causal sequence FLOPs of one forward (spec section 2)."""
    return 4.0 * B * Hq * d * T * (T + 1) / 2


def depth_flops(B: int, Hq: int, T: int, d: int, L: int) -> float:
    """Depth FLOPs of one forward (spec section 2)."""
    return 4.0 * B * Hq * d * T * L


def pass_flops(pass_: str, B: int, Hq: int, T: int, d: int, L: int) -> float:
    """Useful FLOPs of MoDA for fwd / bwd (2.5x fwd) / fwdbwd (3.5x fwd), depth gradients
    included (`moda_bench.floor` has every operator's exact count)."""
    f = seq_flops(B, Hq, T, d) + depth_flops(B, Hq, T, d, L)
    return f * PASS_FACTOR[check_pass(pass_)]


def overhead_pct(m_ms: float, f_ms: float) -> float:
    """The overhead of time m over baseline time f: (m / f - 1) x 100 (the `extra_time_pct`
    column); NaN unless both are positive numbers."""
    return (m_ms / f_ms - 1.0) * 100.0 if _positive(m_ms) and _positive(f_ms) else float("nan")


def extra_time_paper(m_ms: float, f_ms: float) -> float:
    """Extra time as the MoDA paper defines it: (m - f) / m x 100, the share of MoDA's time that
    the baseline does not spend (the paper's 25.86% at T=4096 is 1 - 7.970 / 10.750); NaN unless both are
    positive numbers. overhead = 100 x e / (100 - e) converts one into the other."""
    return (m_ms - f_ms) / m_ms * 100.0 if _positive(m_ms) and _positive(f_ms) else float("nan")


def _positive(x) -> bool:
    try:
        return float(x) > 0          # False for NaN and non-positive numbers
    except (TypeError, ValueError):
        return False


def fill_extra_time(rows) -> None:
    """Set the EXTRA_TIME_PAPER columns of every row of one point of one run (dicts with
    provider, status, median_ms), each against its baseline provider's ok row among them (NaN
    where that baseline has none). The one place these columns are computed: the sweep calls it on
    each point's rows, the report on older files' rows."""
    rows = list(rows)
    base = {r["provider"]: r.get("median_ms") for r in rows if r.get("status") == OK}
    for r in rows:
        for col, prov in EXTRA_TIME_PAPER.items():
            ok = r.get("status") == OK and prov in base
            r[col] = extra_time_paper(r.get("median_ms"), base[prov]) if ok else float("nan")


def source_digest(files: list[tuple[str, bytes]]) -> str:
    """10 hex digits of sha256 over (path, contents) pairs in path order: the package's code."""
    import hashlib
    h = hashlib.sha256()
    for path, data in sorted(files):
        h.update(path.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return h.hexdigest()[:10]


def package_sources() -> list[tuple[str, bytes]]:
    """This installed package's .py files as ("moda_bench/...", bytes) pairs."""
    pkg = Path(__file__).resolve().parent
    return [(p.relative_to(pkg.parent).as_posix(), p.read_bytes()) for p in pkg.rglob("*.py")]


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """Short commit of the source tree; where the checkout differs from it, "-dirty+src" and the
    package's `source_digest`, which names the code actually run even when the .git metadata is
    older than the files (a copied checkout; `tools/run_json.py` finds the commit it matches).
    $MODA_BENCH_GIT_COMMIT overrides; no .git: "unknown+src<digest>"."""
    if os.environ.get("MODA_BENCH_GIT_COMMIT"):
        return os.environ["MODA_BENCH_GIT_COMMIT"]
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        if sha and not dirty:
            return sha
        prefix = sha + "-dirty" if sha else "unknown"
    except (OSError, subprocess.SubprocessError):
        prefix = "unknown"
    return prefix + "+src" + source_digest(package_sources())


def user_cache_dir() -> Path:
    """moda-bench's folder in the platform cache directory (Linux: $XDG_CACHE_HOME or ~/.cache;
    macOS ~/Library/Caches; Windows %LOCALAPPDATA%): where the tuning cache and the GPU health
    record live unless their environment variables say otherwise."""
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    elif sys.platform.startswith("win"):
        base = Path(os.environ.get("LOCALAPPDATA") or (Path.home() / "AppData" / "Local"))
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or (Path.home() / ".cache"))
    return base / "moda-bench"


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
