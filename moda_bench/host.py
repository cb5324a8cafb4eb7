"""The host side of a timing process: how fast this process's CPU issues GPU work (the host
canary), and which CPUs the process runs on (`--pin-cpu`).

Why: an eager row times what a caller sees, and at short sequence lengths that is the host, not
the GPU, and a short eager call's host time varies by a factor of two with the machine and the
CPU core the process runs on (docs/PERFORMANCE.md). So every row carries the
host numbers of the process that timed it (`schema.HOST_COLUMNS`, `host_cpus`):

- `host_canary`: median host microseconds per call, calls issued back to back on the current
  CUDA device: a bare Triton launch with 30 scalar arguments (what an eager Triton operator pays
  per launch), one tiny torch op, and forward + backward through a trivial Python autograd
  Function (the autograd engine's hand-off to its device thread, which dominates short eager
  calls). NaN for what cannot be measured here (no CUDA, no triton); it never raises.
- `parse_pin_cpu`, `check_pin_cpu`, `pin_process`: the `--pin-cpu` option ('off' or CPU ids;
  worker i, a `--gpus` worker or torchrun local rank, takes item i % len) applied with
  `os.sched_setaffinity` to the calling thread, which threads created afterwards inherit.
- `host_cpus`: the `host_cpus` column's text ('all' when unpinned).
- `process_host`: pin (if asked) and run the canary once per process and device; the runner
  stamps its columns on every row.

triton is imported at module level where it is installed (a jitted kernel must be a module-level
function for every triton version the project supports), so only the measuring code paths import
this module; reports, gate and merge never do.
"""
from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional, Sequence

from moda_bench import schema

try:   # the launch canary's kernel; without triton its number is NaN
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - ImportError, or a broken install: the same for us
    triton = tl = None

PIN_OFF = "off"
UNPINNED = "all"
CALLS, WARMUP = 300, 30

if triton is not None:
    # one launch whose cost is the host's: 30 scalar arguments to pack, one number written
    @triton.jit
    def canary_kernel(out, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17,
                      a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, ONE: tl.constexpr):
        tl.store(out + tl.program_id(0) * ONE, a0 + a29)
else:  # pragma: no cover
    canary_kernel = None


# ----------------------------------------------------------------------------- the canary

def median_call_us(fn: Callable[[], object], calls: int = CALLS, warmup: int = WARMUP,
                   sync: Optional[Callable[[], None]] = None) -> float:
    """Median host microseconds of one call of fn over `calls` calls issued back to back, after
    `warmup` calls (sync() after the warm-up and at the end, never between calls)."""
    for _ in range(warmup):
        fn()
    if sync is not None:
        sync()
    times = []
    clock = time.perf_counter_ns
    for _ in range(calls):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    if sync is not None:
        sync()
    return statistics.median(times) / 1e3


def _nan_canary() -> dict:
    return {c: math.nan for c in schema.HOST_COLUMNS}


_PASS_NODE: list = []


def pass_node():
    """The least a Python autograd node can do, as a `torch.autograd.Function`: pass the input
    and the gradient through. Made once, on first use (torch is imported then)."""
    if not _PASS_NODE:
        import torch

        class Pass(torch.autograd.Function):
            @staticmethod
            def forward(ctx, t):
                return t.view_as(t)

            @staticmethod
            def backward(ctx, grad):
                return grad

        _PASS_NODE.append(Pass)
    return _PASS_NODE[0]


def host_canary(calls: int = CALLS, warmup: int = WARMUP, device: Optional[int] = None) -> dict:
    """{host_launch_us, host_op_us, host_autograd_us}: median host microseconds per call on CUDA
    device `device` (None: the current one; see the module docstring); about 0.1 s, plus the
    launch kernel's compilation on a first run with an empty triton cache. NaN values without
    CUDA, and for the launch without triton; a number whose measurement fails is NaN too. Never
    raises."""
    out = _nan_canary()
    try:
        import torch
        if not torch.cuda.is_available():
            return out
        if device is not None:
            with torch.cuda.device(device):
                return host_canary(calls, warmup)
    except Exception:  # noqa: BLE001 - no torch, no CUDA, no such device: all NaN
        return out
    sync = torch.cuda.synchronize
    try:
        x = torch.zeros(1, device="cuda")
        out["host_op_us"] = median_call_us(lambda: x.add_(1), calls, warmup, sync)
    except Exception:  # noqa: BLE001
        pass
    if canary_kernel is not None:
        try:
            buf = torch.zeros(1, device="cuda", dtype=torch.float32)
            args = [float(i) for i in range(30)]
            out["host_launch_us"] = median_call_us(lambda: canary_kernel[(1,)](buf, *args, ONE=1), calls, warmup,
                                                   sync)
        except Exception:  # noqa: BLE001
            pass
    try:
        node = pass_node()
        a = torch.zeros(1, device="cuda", requires_grad=True)
        g = torch.ones(1, device="cuda")
        out["host_autograd_us"] = median_call_us(lambda: node.apply(a).backward(g), calls, warmup, sync)
    except Exception:  # noqa: BLE001
        pass
    return out


# ----------------------------------------------------------------------------- CPU pinning

def parse_pin_cpu(text: Optional[str]) -> tuple:
    """'off' (or None / '') -> (); '3' -> (3,); '3,5,7' -> (3, 5, 7). ValueError, one line naming
    the option, for anything else (repeated ids included)."""
    if text is None or str(text).strip().lower() in ("", PIN_OFF):
        return ()
    try:
        cpus = tuple(int(tok) for tok in str(text).split(","))
    except ValueError:
        cpus = ()
    if not cpus or any(c < 0 for c in cpus):
        raise ValueError(f"--pin-cpu must be 'off' or comma-separated CPU ids such as 3 or 3,5,7,9, got {text!r}")
    if len(set(cpus)) != len(cpus):
        raise ValueError(f"--pin-cpu repeats a CPU id: {text!r}")
    return cpus


def format_pin_cpu(cpus: Sequence[int]) -> str:
    """The option's text of parsed CPU ids: 'off' or '3,5'."""
    return ",".join(str(c) for c in cpus) if cpus else PIN_OFF


def cpu_for_worker(cpus: Sequence[int], worker: int) -> Optional[int]:
    """The CPU worker `worker` (GPU worker index, local rank; 0 for a single process) is pinned
    to: item worker % len; None when pinning is off."""
    return cpus[worker % len(cpus)] if cpus else None


def can_pin() -> bool:
    return hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")


def compact(cpus) -> str:
    """'0-3,7' for {0, 1, 2, 3, 7}."""
    ids, parts = sorted(cpus), []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)


_ALLOWED: list = []   # the process's affinity before it first pinned itself (a pinned worker may re-pin)


def allowed_cpus() -> set:
    """The CPUs this process may run on: its affinity when first asked, before any pinning."""
    if not _ALLOWED:
        _ALLOWED.append(frozenset(os.sched_getaffinity(0)))
    return set(_ALLOWED[0])


def check_pin_cpu(cpus: Sequence[int], allowed: Optional[set] = None) -> None:
    """ValueError (one line) when pinning is asked for on a platform without
    os.sched_setaffinity, or names a CPU this process may not run on (allowed: its affinity,
    `allowed_cpus`)."""
    if not cpus:
        return
    if not can_pin():
        raise ValueError("--pin-cpu: this platform cannot pin a process to a CPU (no os.sched_setaffinity); "
                         "use --pin-cpu off")
    allowed = allowed_cpus() if allowed is None else set(allowed)
    bad = [c for c in cpus if c not in allowed]
    if bad:
        raise ValueError(f"--pin-cpu: CPU {', '.join(map(str, bad))} not available to this process "
                         f"(allowed: {compact(allowed)})")


def pin_process(cpus: Sequence[int], worker: int = 0) -> Optional[int]:
    """Pin the calling thread (and the threads it creates afterwards) to worker's CPU
    (`cpu_for_worker`); the CPU, or None when pinning is off. ValueError as check_pin_cpu."""
    cpu = cpu_for_worker(cpus, worker)
    if cpu is None:
        return None
    check_pin_cpu([cpu])
    os.sched_setaffinity(0, {cpu})
    return cpu


def host_cpus() -> str:
    """The `host_cpus` column: 'all' when the process may run on every CPU of the machine (or
    the platform cannot tell), else its CPUs, e.g. '3' or '0-7'."""
    if not can_pin():
        return UNPINNED
    mine = set(os.sched_getaffinity(0))
    return UNPINNED if mine == set(range(os.cpu_count() or 0)) else compact(mine)


# ----------------------------------------------------------------------------- per process

@dataclass(frozen=True)
class HostState:
    """A timing process's host: its CPUs (the `host_cpus` text), the canary numbers, the pinned
    CPU (None: not pinned by us), the worker index and pid."""

    host_cpus: str
    host_launch_us: float
    host_op_us: float
    host_autograd_us: float
    pinned: Optional[int] = None
    worker: int = 0
    pid: int = 0

    def columns(self) -> dict:
        """The row columns: schema.HOST_COLUMNS and host_cpus."""
        return {c: getattr(self, c) for c in schema.HOST_COLUMNS + ["host_cpus"]}

    def as_dict(self) -> dict:
        return asdict(self)


def describe(values: dict) -> str:
    """One line of a canary's numbers (a HostState's columns or host_canary's dict)."""
    def us(c):
        v = values.get(c)
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1f} us"
    text = (f"Triton launch {us('host_launch_us')}, torch op {us('host_op_us')}, "
            f"autograd fwd+bwd {us('host_autograd_us')}")
    return f"CPUs {values['host_cpus']}; {text}" if values.get("host_cpus") else text


_STATES: dict = {}


def process_host(cpus: Sequence[int] = (), worker: int = 0, *,
                 canary: Optional[Callable[[], dict]] = None) -> HostState:
    """Pin this process to worker's CPU (if cpus) and run the host canary, once per process,
    pin request and CUDA device; later calls return the same HostState. ValueError when the
    pin cannot be applied (check_pin_cpu). canary: what measures (default host_canary)."""
    device = -1
    try:
        import torch
        if torch.cuda.is_available():
            device = torch.cuda.current_device()
    except Exception:  # noqa: BLE001 - no CUDA: the canary says NaN
        pass
    key = (tuple(cpus), worker, device, os.getpid())
    if key not in _STATES:
        pinned = pin_process(cpus, worker)
        _STATES[key] = HostState(host_cpus=host_cpus(), pinned=pinned, worker=worker, pid=os.getpid(),
                                 **(canary or host_canary)())
    return _STATES[key]


def forget() -> None:
    """Drop the memoised states and the recorded affinity (tests)."""
    _STATES.clear()
    _ALLOWED.clear()
