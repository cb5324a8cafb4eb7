"""GPU state and health: what the GPU was doing while a row was timed, and whether it is fit to
benchmark on.

Owns:
* NVML access (`pynvml`, from the optional `nvidia-ml-py` package). Without it, or without a
  GPU, every function returns empty values (None, '' or []) and nothing raises at import.
* `GpuSampler`: a context manager polling SM / memory clocks, power, temperature and the
  clocks-event (throttle) reasons of one device in a background thread during a timed row;
  `summary()` gives the row columns `GPU_COLUMNS`.
* `gpu_header`: the run header (name, UUID, driver, power limit, max clocks, ECC, other
  processes on the GPU).
* The health canary (`run_canary`: a bf16 8192^3 matmul in TFLOP/s and a 1 GiB device copy in
  GB/s counting read + write, timed with moda_bench.timing), the references it is compared with
  (this machine's healthy record in the moda-bench cache folder, else `KNOWN_GPUS`: approximate,
  conservative numbers), the verdict logic `judge` -> `Verdict` ('healthy', 'degraded', 'shared',
  'unknown') and `check_health`, the < 2 s check run at the start and end of a run.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

from moda_bench import schema, timing

GPU_COLUMNS = ["sm_clock_mhz", "sm_clock_min_mhz", "mem_clock_mhz", "power_w", "temp_c", "throttle"]
# NVML clocks-event ("throttle") reason bits; 0x1 (gpu idle) and 0x2 (applications clocks
# setting) are not throttling and are ignored.
THROTTLE_BITS = {
    0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal",
    0x40: "hw_thermal", 0x80: "hw_power_brake", 0x100: "display_clock",
}
GPU_IDLE_BIT = 0x1
HARD_THROTTLE = ("hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")
# (substrings all in the lower-case GPU name, label, bf16 matmul TFLOP/s, copy GB/s read + write):
# APPROXIMATE achievable numbers, set conservatively below what a healthy card reaches (cuBLAS
# 8192^3 bf16, device-to-device copy). A machine's own healthy record is preferred over these.
KNOWN_GPUS = [
    (("h200", "nvl"), "H200 NVL", 550.0, 3800.0),
    (("h200",), "H200", 650.0, 3800.0),
    (("h100", "pcie"), "H100 PCIe", 350.0, 1500.0),
    (("h100", "hbm3"), "H100 SXM (HBM3)", 600.0, 2600.0),
    (("a100", "80gb"), "A100 80GB", 250.0, 1500.0),
    (("a100",), "A100 40GB", 250.0, 1200.0),
]
MIN_FRACTION_RECORD = 0.85   # of this machine's healthy record
MIN_FRACTION_TABLE = 0.8     # of the KNOWN_GPUS number
MIN_CLOCK_FRACTION = 0.6     # median SM clock under load below this * max clock = throttled hard
RECORD_RUNS = 5              # healthy runs kept per GPU; the reference is their median
ENV_CACHE = "MODA_BENCH_HEALTH_CACHE"
STATUSES = ("healthy", "degraded", "shared", "unknown")

_nvml_lock = threading.Lock()
_nvml_state: dict = {}


# ----------------------------------------------------------------------------- NVML access

def nvml():
    """The initialised pynvml module, or None (not installed, no driver, no GPU)."""
    with _nvml_lock:
        if "mod" not in _nvml_state:
            try:
                import pynvml
                pynvml.nvmlInit()
                _nvml_state["mod"] = pynvml
            except Exception:   # noqa: BLE001 - ImportError, NVMLError_LibraryNotFound, ...
                _nvml_state["mod"] = None
        return _nvml_state["mod"]


def reset_nvml() -> None:
    """Forget the NVML state, so the next `nvml()` imports and initialises again."""
    with _nvml_lock:
        _nvml_state.clear()


def cuda_available() -> bool:
    """Whether torch sees a CUDA GPU (False without torch)."""
    try:
        import torch
        return bool(torch.cuda.is_available())
    except Exception:   # noqa: BLE001
        return False


def device_handle(device_index: int = 0):
    """The NVML handle of torch's cuda:device_index (matched by UUID, so CUDA_VISIBLE_DEVICES
    is honoured), or None."""
    nv = nvml()
    if nv is None:
        return None
    try:
        if cuda_available():
            import torch
            uuid = str(getattr(torch.cuda.get_device_properties(device_index), "uuid", "") or "")
            if uuid:
                return nv.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else "GPU-" + uuid)
        visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        if visible and visible[device_index].strip().isdigit():
            return nv.nvmlDeviceGetHandleByIndex(int(visible[device_index]))
        return nv.nvmlDeviceGetHandleByIndex(device_index)
    except Exception:   # noqa: BLE001
        return None


def _call(fn: Callable, *args, default=None):
    try:
        return fn(*args)
    except Exception:   # noqa: BLE001 - NVML raises for unsupported queries
        return default


def _text(x) -> Optional[str]:
    return x.decode() if isinstance(x, bytes) else x


def throttle_names(mask: Optional[int]) -> list:
    """Names of the throttle reasons set in an NVML clocks-event mask (idle bits ignored)."""
    if not mask:
        return []
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit]


# ----------------------------------------------------------------------------- sampler

def nvml_reader(handle) -> Optional[Callable[[], dict]]:
    """A function polling one device: dict(sm, mem (MHz), power (W), temp (C), reasons (mask))."""
    nv = nvml()
    if nv is None or handle is None:
        return None
    events = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)

    def read() -> dict:
        power = _call(nv.nvmlDeviceGetPowerUsage, handle)
        return {"sm": _call(nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_SM),
                "mem": _call(nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_MEM),
                "power": None if power is None else power / 1000.0,
                "temp": _call(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU),
                "reasons": _call(events, handle) if events else None}
    return read


def summarize_gpu(polls: list) -> dict:
    """Row columns (GPU_COLUMNS) of a list of polls: sm_clock_mhz (median), sm_clock_min_mhz,
    mem_clock_mhz (median), power_w (mean), temp_c (max), throttle ('a|b' of the reasons seen,
    '' when none; None when not read). Clocks and power count only polls without the 'gpu idle'
    reason (an idle GPU parks its clocks), unless all are idle. All None without polls."""
    busy = [p for p in polls if not int(p.get("reasons") or 0) & GPU_IDLE_BIT] or polls

    def vals(key, among=busy):
        return [p[key] for p in among if p.get(key) is not None]

    sm, mem, power, temp, masks = vals("sm"), vals("mem"), vals("power"), vals("temp", polls), vals("reasons", polls)
    seen = 0
    for m in masks:
        seen |= int(m)
    return {
        "sm_clock_mhz": float(statistics.median(sm)) if sm else None,
        "sm_clock_min_mhz": float(min(sm)) if sm else None,
        "mem_clock_mhz": float(statistics.median(mem)) if mem else None,
        "power_w": float(statistics.fmean(power)) if power else None,
        "temp_c": float(max(temp)) if temp else None,
        "throttle": "|".join(throttle_names(seen)) if masks else None,
    }


# a row's own GPU state: the point's columns summarised over the polls taken while that provider's
# repetitions ran (GpuSampler.summary(tagged=provider)), next to the whole point's
OWN_COLUMNS = {"own_sm_clock_mhz": "sm_clock_mhz", "own_power_w": "power_w"}


class GpuSampler:
    """`with GpuSampler(device_index) as s: <timed row>`, then `s.summary()` -> row columns.

    Polls every interval_s in a daemon thread (plus once at entry and exit, so short rows get
    data). reader: a zero-argument poll function (tests); default NVML. Without NVML it does
    nothing and summary() has only None values. tag: a zero-argument function read at every poll
    (what is running now, e.g. the provider whose repetitions an interleaved round is timing);
    `summary(tagged=x)` then summarises only the polls taken while it returned x."""

    def __init__(self, device_index: int = 0, interval_s: float = 0.025,
                 reader: Optional[Callable[[], dict]] = None, tag: Optional[Callable[[], object]] = None):
        self.device_index, self.interval_s = device_index, interval_s
        self.reader, self.tag = reader, tag
        self.polls: list = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _poll(self) -> None:
        try:
            poll = self.reader()
            if self.tag is not None:
                poll = dict(poll, tag=self.tag())
            self.polls.append(poll)
        except Exception:   # noqa: BLE001 - a failed poll is a missing poll
            pass

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._poll()

    def __enter__(self) -> "GpuSampler":
        if self.reader is None:
            self.reader = nvml_reader(device_handle(self.device_index))
        if self.reader is not None:
            self._poll()
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="moda-bench-gpu-sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> bool:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._poll()
        return False

    def summary(self, tagged=None) -> dict:
        """summarize_gpu of the polls; with more than two, the entry poll (taken before the work
        started, clocks possibly parked) is left out. tagged: only the polls whose tag was this
        (all None when there were none)."""
        polls = list(self.polls)
        if tagged is not None:
            return summarize_gpu([p for p in polls if p.get("tag") == tagged])
        return summarize_gpu(polls[1:] if len(polls) > 2 else polls)


# ----------------------------------------------------------------------------- run header

def other_processes(device_index: int = 0) -> list:
    """Processes other than this one using the GPU: [{'pid', 'used_mb'}]. Where NVML reports pids
    of another PID namespace (a container) and this process is not in its list, one entry not
    visible in /proc is taken to be this process when it holds a CUDA context."""
    nv, handle = nvml(), device_handle(device_index)
    if nv is None or handle is None:
        return []
    procs = {}
    for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        for p in _call(getattr(nv, fn, lambda h: []), handle, default=[]) or []:
            used = getattr(p, "usedGpuMemory", None)
            procs[p.pid] = {"pid": int(p.pid), "used_mb": None if used is None else round(used / 2**20, 1)}
    me = os.getpid()
    if me in procs:
        procs.pop(me)
    elif _holds_cuda_context():
        hidden = [pid for pid in procs if not os.path.exists(f"/proc/{pid}")]
        if hidden:
            procs.pop(hidden[0])
    return sorted(procs.values(), key=lambda p: p["pid"])


def _holds_cuda_context() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and _call(torch.cuda.is_initialized, default=False))


def gpu_header(device_index: int = 0) -> dict:
    """name, uuid, driver, power_limit_w, max_sm_clock_mhz, max_mem_clock_mhz, ecc (bool),
    other_processes; None / [] for what cannot be read (name from torch without NVML)."""
    out = {"name": None, "uuid": None, "driver": None, "power_limit_w": None, "max_sm_clock_mhz": None,
           "max_mem_clock_mhz": None, "ecc": None, "other_processes": []}
    if cuda_available():
        import torch
        out["name"] = _call(torch.cuda.get_device_name, device_index)
    nv, h = nvml(), device_handle(device_index)
    if nv is None or h is None:
        return out
    limit = _call(nv.nvmlDeviceGetEnforcedPowerLimit, h)
    ecc = _call(nv.nvmlDeviceGetEccMode, h)
    out.update(
        name=_text(_call(nv.nvmlDeviceGetName, h)) or out["name"],
        uuid=_text(_call(nv.nvmlDeviceGetUUID, h)),
        driver=_text(_call(nv.nvmlSystemGetDriverVersion)),
        power_limit_w=None if limit is None else limit / 1000.0,
        max_sm_clock_mhz=_call(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM),
        max_mem_clock_mhz=_call(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_MEM),
        ecc=None if not ecc else bool(ecc[0]),
        other_processes=other_processes(device_index),
    )
    return out


# ----------------------------------------------------------------------------- references

def known_reference(name: Optional[str]) -> Optional[dict]:
    """The KNOWN_GPUS entry for a GPU name: {'label', 'matmul_tflops', 'copy_gbps'}, or None."""
    low = (name or "").lower()
    for parts, label, tflops, gbps in KNOWN_GPUS:
        if all(p in low for p in parts):
            return {"label": label, "matmul_tflops": tflops, "copy_gbps": gbps}
    return None


def health_cache_path(path=None) -> Path:
    """Explicit path, else $MODA_BENCH_HEALTH_CACHE, else <platform cache dir>/moda-bench/health.json
    (Linux: $XDG_CACHE_HOME or ~/.cache), beside the tuning cache."""
    if path:
        return Path(path).expanduser()
    if os.environ.get(ENV_CACHE):
        return Path(os.environ[ENV_CACHE]).expanduser()
    return schema.user_cache_dir() / "health.json"


def record_key(name: Optional[str], uuid: Optional[str]) -> str:
    return f"{name}|{uuid}"


def _load_entries(path) -> dict:
    try:
        data = json.loads(health_cache_path(path).read_text())
        return data.get("entries", {}) if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def load_record(name: Optional[str], uuid: Optional[str], path=None) -> Optional[dict]:
    """This machine's healthy reference: median matmul_tflops / copy_gbps over the last
    RECORD_RUNS healthy runs, with 'runs' (their count); None when there is none."""
    runs = _load_entries(path).get(record_key(name, uuid), {}).get("runs", [])
    try:
        return {"matmul_tflops": statistics.median(float(r["matmul_tflops"]) for r in runs),
                "copy_gbps": statistics.median(float(r["copy_gbps"]) for r in runs), "runs": len(runs)}
    except (KeyError, TypeError, ValueError, statistics.StatisticsError):
        return None


def save_record(name: Optional[str], uuid: Optional[str], matmul_tflops: float, copy_gbps: float,
                path=None, driver: Optional[str] = None) -> Path:
    """Append one healthy run (keeping the last RECORD_RUNS) to the health cache, atomically."""
    p = health_cache_path(path)
    entries = _load_entries(p)
    runs = entries.get(record_key(name, uuid), {}).get("runs", [])
    runs.append({"matmul_tflops": float(matmul_tflops), "copy_gbps": float(copy_gbps), "driver": driver,
                 "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")})
    entries[record_key(name, uuid)] = {"runs": runs[-RECORD_RUNS:]}
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f"{p.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"schema_version": 1, "entries": entries}, indent=1, sort_keys=True))
    os.replace(tmp, p)
    return p


# ----------------------------------------------------------------------------- canary and verdict

@dataclass
class Verdict:
    """Whether the GPU is fit to benchmark on: status in STATUSES, a one-line reason, the canary
    numbers, the reference they were compared with ('record (n runs)', 'table: <label>' or
    'none'), the GPU state during the canary (GPU_COLUMNS) and the other processes seen."""

    status: str
    reason: str
    name: Optional[str] = None
    uuid: Optional[str] = None
    matmul_tflops: Optional[float] = None
    copy_gbps: Optional[float] = None
    ref_matmul_tflops: Optional[float] = None
    ref_copy_gbps: Optional[float] = None
    ref_source: str = "none"
    gpu: dict = field(default_factory=dict)
    other_processes: list = field(default_factory=list)
    header: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "healthy"

    def as_dict(self) -> dict:
        return asdict(self)


def judge(matmul_tflops: float, copy_gbps: float, *, name: Optional[str] = None, uuid: Optional[str] = None,
          record: Optional[dict] = None, gpu: Optional[dict] = None, other: Optional[list] = None,
          max_sm_clock_mhz: Optional[float] = None, strict: bool = False) -> Verdict:
    """The verdict on canary numbers. Reference: record (this machine's healthy median) if given,
    else the KNOWN_GPUS entry of name. 'shared' when other processes use the GPU; 'degraded' when
    a number is below MIN_FRACTION_RECORD / MIN_FRACTION_TABLE of its reference (0.9 for both when
    strict), a hard throttle reason (HARD_THROTTLE) was seen, or the median SM clock was below
    MIN_CLOCK_FRACTION of max_sm_clock_mhz; strict also fails a GPU with no reference."""
    gpu, other = dict(gpu or {}), list(other or [])
    if record:
        ref, source, frac = record, f"record ({record.get('runs', '?')} runs)", MIN_FRACTION_RECORD
    else:
        ref = known_reference(name)
        source = f"table: {ref['label']} (approx.)" if ref else "none"
        frac = MIN_FRACTION_TABLE
    frac = max(frac, 0.9) if strict else frac
    v = Verdict("healthy", "", name=name, uuid=uuid, matmul_tflops=matmul_tflops, copy_gbps=copy_gbps,
                ref_matmul_tflops=ref["matmul_tflops"] if ref else None,
                ref_copy_gbps=ref["copy_gbps"] if ref else None,
                ref_source=source, gpu=gpu, other_processes=other)
    shared, degraded = [], []
    if other:
        shown = ", ".join(f"pid {p['pid']}" + (f" ({p['used_mb']:.0f} MB)" if p.get("used_mb") is not None else "")
                          for p in other[:3])
        shared.append(f"{len(other)} other process(es) on the GPU: {shown}" + (" ..." if len(other) > 3 else ""))
    for what, got, want, unit in (("bf16 matmul", matmul_tflops, v.ref_matmul_tflops, "TFLOP/s"),
                                  ("copy", copy_gbps, v.ref_copy_gbps, "GB/s")):
        if want and (got is None or got < frac * want):
            degraded.append(f"{what} {got or 0:.0f} {unit} < {frac:.0%} of {want:.0f} ({source})")
    hard = [t for t in (gpu.get("throttle") or "").split("|") if t in HARD_THROTTLE]
    if hard:
        degraded.append("clocks throttled: " + "|".join(hard))
    sm = gpu.get("sm_clock_mhz")
    if sm and max_sm_clock_mhz and sm < MIN_CLOCK_FRACTION * max_sm_clock_mhz:
        degraded.append(f"SM clock {sm:.0f} MHz is {sm / max_sm_clock_mhz:.0%} of max {max_sm_clock_mhz:.0f}")
    if strict and not ref:
        degraded.append(f"no reference for {name!r} (strict)")
    if shared or degraded:
        v.status = "shared" if shared else "degraded"
        v.reason = "; ".join(shared + degraded)
    elif ref:
        v.reason = (f"bf16 matmul {matmul_tflops:.0f} TFLOP/s ({matmul_tflops / ref['matmul_tflops']:.0%}), "
                    f"copy {copy_gbps:.0f} GB/s ({copy_gbps / ref['copy_gbps']:.0%}) of {source}")
    else:
        v.reason = (f"no reference for {name!r}: bf16 matmul {matmul_tflops:.0f} TFLOP/s, copy {copy_gbps:.0f} GB/s "
                    "become this machine's reference")
    return v


@dataclass
class Canary:
    """Canary numbers with their Measurements (moda_bench.timing)."""

    matmul_tflops: float
    copy_gbps: float
    matmul: timing.Measurement
    copy: timing.Measurement


def run_canary(n: int = 8192, copy_bytes: int = 2**30, *, warmup_s: float = 0.25,
               rule: Optional[timing.StopRule] = None) -> Canary:
    """Time a bf16 n^3 matmul (2 n^3 FLOP) and a copy_bytes device-to-device copy (2 * bytes moved)
    on the current CUDA device, eager timer, L2 flushed. The matmul warms up warmup_s so the
    power-capped steady state is measured, not the first cool burst."""
    rule = rule or timing.StopRule(min_samples=10, min_time_s=0.05, max_time_s=0.5)
    mm = _time_matmul(n, rule, warmup_s)
    cp = _time_copy(copy_bytes, rule)
    return Canary(2.0 * n ** 3 / (mm.median_ms * 1e-3) / 1e12, 2.0 * copy_bytes / (cp.median_ms * 1e-3) / 1e9, mm, cp)


def _time_matmul(n: int, rule, warmup_s: float):
    import torch
    a, b, c = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    return timing.time_fn(lambda: torch.matmul(a, b, out=c), rule=rule, warmup_s=warmup_s)


def _time_copy(nbytes: int, rule):
    import torch
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return timing.time_fn(lambda: dst.copy_(src), rule=rule, warmup_s=0.02)


def check_health(device_index: int = 0, *, record: bool = True, strict: bool = False, cache_path=None,
                 header: Optional[dict] = None) -> Verdict:
    """Header, canary (with a GpuSampler running) and verdict for cuda:device_index: about 0.5 s
    in a process that already uses the GPU (a fresh one adds CUDA's start-up, a few seconds).
    Never raises for a missing GPU or NVML: status 'unknown' then. A healthy verdict is appended
    to this machine's record when `record`."""
    if not cuda_available():
        return Verdict("unknown", "no CUDA GPU visible")
    import torch
    with torch.cuda.device(device_index):
        header = header if header is not None else gpu_header(device_index)
        tiny = timing.StopRule(min_samples=1, min_time_s=0.0, max_time_s=0.0)
        run_canary(1024, 2**20, warmup_s=0.0, rule=tiny)   # context, cuBLAS: outside the sampled window
        t0 = time.perf_counter()
        with GpuSampler(device_index) as sampler:
            canary = run_canary()
        torch.cuda.empty_cache()
    gpu = sampler.summary()
    name, uuid = header.get("name"), header.get("uuid")
    ref = load_record(name, uuid, cache_path)
    v = judge(canary.matmul_tflops, canary.copy_gbps, name=name, uuid=uuid, record=ref, gpu=gpu,
              other=header.get("other_processes"), max_sm_clock_mhz=header.get("max_sm_clock_mhz"), strict=strict)
    v.header = dict(header, canary_s=round(time.perf_counter() - t0, 3))
    if record and v.ok:
        try:
            save_record(name, uuid, canary.matmul_tflops, canary.copy_gbps, cache_path, header.get("driver"))
        except OSError:
            pass
    return v


__all__ = [
    "GPU_COLUMNS", "THROTTLE_BITS", "HARD_THROTTLE", "KNOWN_GPUS", "STATUSES", "nvml", "reset_nvml",
    "cuda_available",
    "device_handle", "throttle_names", "nvml_reader", "summarize_gpu", "GpuSampler", "other_processes",
    "gpu_header", "known_reference", "health_cache_path", "record_key", "load_record", "save_record",
    "Verdict", "judge", "Canary", "run_canary", "check_health",
]
