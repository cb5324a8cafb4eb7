"""`moda-bench doctor`: is this GPU fit to benchmark on? Prints the run header (GPU, driver,
power limit, clocks, ECC, other processes), the health canary (bf16 matmul TFLOP/s, device copy
GB/s) against this machine's healthy record or the approximate table, the GPU state during the
canary, the host canary beside it (moda_bench.host: the host microseconds of a Triton launch, a
torch op and an autograd fwd+bwd, and the CPUs this process may run on), and the verdict
(moda_bench.health.check_health). Exit 0 when healthy, 1 otherwise (the host numbers inform, they
do not fail the check); without a CUDA GPU one line and exit 1.
"""
from __future__ import annotations

import os
from typing import Optional

import typer

from moda_bench import health, host

NO_GPU = "no CUDA GPU visible: doctor needs one"


def _fmt(x, spec: str = ".0f", unit: str = "") -> str:
    if x is None or x == "":
        return "-"
    return f"{x:{spec}}{unit}" if isinstance(x, (int, float)) else str(x)


def verdict_tables(v: health.Verdict):
    """(header table, canary table) of a verdict, as rich Tables."""
    from rich.table import Table
    h = v.header or {}
    head = Table(title=f"GPU {h.get('device_index', '')}".strip(), show_header=False, title_justify="left")
    head.add_column("what", style="bold")
    head.add_column("value")
    others = h.get("other_processes") or []
    for what, value in (
        ("name", h.get("name")), ("uuid", h.get("uuid")), ("driver", h.get("driver")),
        ("power limit", _fmt(h.get("power_limit_w"), ".0f", " W")),
        ("max clocks SM / mem", f"{_fmt(h.get('max_sm_clock_mhz'))} / {_fmt(h.get('max_mem_clock_mhz'))} MHz"),
        ("ECC", {True: "on", False: "off"}.get(h.get("ecc"), "-")),
        ("other processes", ", ".join(f"pid {p['pid']} ({_fmt(p.get('used_mb'))} MB)" for p in others) or "none"),
    ):
        head.add_row(what, _fmt(value))
    canary = Table(title="health canary", title_justify="left")
    for col in ("test", "measured", "reference", "fraction", "reference source"):
        canary.add_column(col, justify="left" if col in ("test", "reference source") else "right")
    for test, got, ref, unit in (("bf16 matmul 8192^3", v.matmul_tflops, v.ref_matmul_tflops, "TFLOP/s"),
                                 ("device copy 1 GiB (r+w)", v.copy_gbps, v.ref_copy_gbps, "GB/s")):
        frac = f"{got / ref:.0%}" if got and ref else "-"
        canary.add_row(test, f"{_fmt(got)} {unit}", f"{_fmt(ref)} {unit}" if ref else "-", frac, v.ref_source)
    g = v.gpu or {}
    canary.caption = (f"during the canary: SM {_fmt(g.get('sm_clock_mhz'))} MHz "
                      f"(min {_fmt(g.get('sm_clock_min_mhz'))}), "
                      f"mem {_fmt(g.get('mem_clock_mhz'))} MHz, {_fmt(g.get('power_w'))} W, {_fmt(g.get('temp_c'))} C, "
                      f"throttle: {g.get('throttle') or ('none' if g.get('throttle') == '' else '-')}")
    return head, canary


def host_table(values: dict, affinity: str):
    """The host canary's numbers (host.host_canary's dict) and the process's CPUs, as a rich Table."""
    from rich.table import Table
    table = Table(title="host canary (median host us per call, issued back to back)", title_justify="left")
    table.add_column("test")
    table.add_column("host us", justify="right")
    for what, col in (("bare Triton launch, 30 scalar arguments", "host_launch_us"),
                      ("one tiny torch op (in-place add)", "host_op_us"),
                      ("autograd fwd + backward of a trivial Python Function", "host_autograd_us")):
        v = values.get(col)
        table.add_row(what, _fmt(None if isinstance(v, float) and v != v else v, ".1f"))   # NaN: not measured
    table.caption = (f"CPU affinity: {affinity}. Eager rows at short T time the host: pin a sweep with "
                     "--pin-cpu to compare runs on one core")
    return table


ROUTE_SHAPES = ((4096, 8, 64), (16384, 8, 64), (65536, 8, 64))   # (T, G, L) at B=1, Hk=8, d=64, bf16


def routes_text(device: int) -> str:
    """Which MoDA implementation `moda_attention` (impl "auto") runs here at a few standard shapes
    (training, depth gradients on), one line each; never raises."""
    from moda_bench.kernels.moda import dispatch
    try:
        lines = dispatch.explain(ROUTE_SHAPES, device=f"cuda:{device}")
    except Exception as exc:   # noqa: BLE001 - a report line, not a failure of the check
        return f"MoDA routes: cannot tell ({type(exc).__name__}: {exc})"
    return "\n".join([f"MoDA routes on cuda:{device} (moda_attention, impl='auto'; `moda-bench dispatch` for more):"]
                     + ["  " + ln for ln in lines])


def doctor_command(
    device: int = typer.Option(0, "--device", "-d", help="CUDA device index to check."),
    strict: bool = typer.Option(False, "--strict", help="Tighter thresholds (90% of the reference) and fail "
                                "a GPU with no reference (unknown model, no healthy record)."),
    record: bool = typer.Option(True, "--record/--no-record", help="Append a healthy result to this machine's "
                                "record (the moda-bench cache folder, health.json)."),
    cache: Optional[str] = typer.Option(None, "--cache", help="Health record file (default "
                                        "$MODA_BENCH_HEALTH_CACHE or <cache dir>/moda-bench/health.json)."),
) -> None:
    """Check that the GPU is healthy and not shared before benchmarking (exit 1 if not)."""
    from rich.console import Console
    console = Console()
    if not health.cuda_available():
        console.print(NO_GPU, markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    try:
        v = health.check_health(device, record=record, strict=strict, cache_path=cache)
    except Exception as exc:   # noqa: BLE001 - a broken GPU is a verdict, not a traceback
        console.print(f"doctor: the health canary failed on cuda:{device}: {type(exc).__name__}: {exc}",
                      markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    v.header.setdefault("device_index", device)
    for table in verdict_tables(v):
        console.print(table)
    values = host.host_canary(device=device)   # never raises: NaN for what it cannot measure
    cpus = host.host_cpus()
    console.print(host_table(values, cpus if cpus != host.UNPINNED else f"all ({os.cpu_count()} CPUs)"))
    console.print(routes_text(device), markup=False, highlight=False, soft_wrap=True)
    style = {"healthy": "bold green", "degraded": "bold red", "shared": "bold yellow"}.get(v.status, "bold")
    console.print(f"[{style}]{v.status}[/]: ", end="")
    console.print(v.reason, markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(0 if v.ok else 1)
