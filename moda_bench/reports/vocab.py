"""The report's own vocabulary, shared by its tables, Markdown and figures: which providers play
which role, display orders and labels, cell formatting, and `ReportError`.

Everything that is the results schema (columns, row key, axes, pass names) comes from
`moda_bench.schema`; this module holds only what the report adds on top of it.
"""
from __future__ import annotations

import math
import re

from moda_bench import schema

ENV_COLUMNS = ["gpu", "torch_version", "triton_version", "git_commit"]
RUN_COLUMNS = ENV_COLUMNS + ["timestamp"]
PAPER_AXES = ["T", "G", "L"]                      # the axes the paper swept (schema.AXES adds C)
ABLATION_SWEEP = "ablation"
LADDER = ["naive-torch", "flash-compatible", "chunk-aware", "group-aware", "depth-bwd-in-dq", "shipped-kernel",
          "batched-tiles", "tma-fwd", "tma-bwd", "ours", "moda-triton", "moda"]
FA2_PROVIDERS = ("fa2", "fa2-triton")             # first present is the FA2 baseline unless chosen
# the MoDA entry point (`moda`, the dispatcher; committed rows of the Triton kernel read as moda-triton)
MODA_PROVIDERS = ("moda", "moda-triton", "ours")
ALWAYS_SHOWN = ["cudnn", "flex"]                  # efficiency columns present even when not measured
RATIO_BASELINE = "fa2"                            # what the CSVs' ratio_to_fa2 (+ _lo/_hi) is measured against
# MoDA on other kernels: shown with their ratio to the fastest
MODA_VARIANTS = ("moda-fused", "moda-overlap", "moda-fa4")
# efficiency columns placed before ALWAYS_SHOWN when measured
LEADING_OTHERS = ("moda-fused", "moda-overlap", "moda-fa4", "fa4")
SEQUENCE_ONLY = ("fa2", "fa4", "cudnn", "fa2-triton")   # candidates of best_provider (no depth part)
PROVIDER_RANK = ["moda", "moda-triton", "ours", "moda-fused", "moda-overlap", "moda-fa4", "moda-nosplit", "dattn",
                 "dattn-torch", "dattn-mix", "fa2", "fa4", "fa2-triton", "cudnn", "flex", "flashinfer"]
# decode (pass schema.DECODE_PASS): its providers in display order; the sequence-only ones are the
# candidates of its best_provider
DECODE_PROVIDERS = ("moda", "moda-nosplit", "fa2", "cudnn", "fa4", "flashinfer")
DECODE_SEQUENCE_ONLY = ("fa2", "cudnn", "fa4", "flashinfer")
DECODE_TIMERS = ("graph", "eager")                # a decode point's timers, display order (graph first)
# Depth-Attention: its providers (a sweep holding one is a Depth-Attention sweep), the methods its
# table compares (overhead over the fastest attention) and the mix kernel timed alone
DATTN_PROVIDERS = ("dattn", "dattn-torch", "dattn-mix")
DATTN_METHODS = ("dattn", "dattn-composed", "dattn-torch", "moda", "moda-triton", "moda-fa4", "moda-overlap")
MIX_PROVIDER = "dattn-mix"
TIMER_ORDER = ["eager", "graph", "do_bench"]      # timer values of the sweeps, display order
TIMER_LABEL = {"eager": "eager timer (host-inclusive)", "graph": "graph timer (CUDA-graph replays, device time)",
               "do_bench": "do_bench timer (triton's do_bench, each provider on its own, as earlier runs)"}
GPU_STATE_COLUMNS = ["sm_clock_mhz", "sm_clock_min_mhz", "mem_clock_mhz", "power_w", "temp_c"]
HEALTHY = "healthy"
CEILING_PROVIDER = "matmul"
DEFAULT_CEILING_TFLOPS = 784.0                    # bf16 matmul on the project's H100 (spec section 5)
PASS_ORDER = ["fwdbwd", "fwd", "bwd", "decode"]   # display order of schema.PASSES: the paper's pass first
PASS_LABEL = {"fwdbwd": "fwd+bwd", "fwd": "fwd", "bwd": "bwd", "decode": "decode"}
# the column a sweep varies, where its name does not say: S before L (an S sweep sets L = S too)
AXIS_PREFERENCE = ("S",) + tuple(a for a in schema.AXES if a != "S") + ("d", "Hk")
MISSING = "-"


class ReportError(Exception):
    """A user-facing problem with the inputs (one line, no traceback)."""


def sort_passes(passes) -> list[str]:
    """Distinct pass names in PASS_ORDER (unknown ones after, alphabetically)."""
    return sorted(set(passes), key=lambda p: (PASS_ORDER.index(p) if p in PASS_ORDER else len(PASS_ORDER), p))


def natural_key(text: str) -> tuple:
    """Sort key reading the digit runs of `text` as numbers ('decode-T2048' before 'decode-T8192')."""
    parts = re.split(r"(\d+)", str(text))
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts))


def sort_sweeps(sweeps) -> list[str]:
    """Distinct sweep names in schema.AXES order (other sweeps after, in natural order)."""
    return sorted(set(sweeps), key=lambda s: (schema.AXES.index(s) if s in schema.AXES else len(schema.AXES),
                                              natural_key(s), s))


def swept_axis(frame, sweep: str | None = None) -> str:
    """The configuration column a sweep varies: its name when that is one of AXIS_PREFERENCE, else
    the first column of AXIS_PREFERENCE taking several values in `frame`, else T."""
    if sweep in AXIS_PREFERENCE:
        return sweep
    for c in AXIS_PREFERENCE:
        if c in frame and frame[c].nunique() > 1:
            return c
    return "T"


def sort_timers(timers) -> list[str]:
    """Distinct timer names in TIMER_ORDER (unknown ones after, alphabetically)."""
    return sorted(set(timers), key=lambda t: (TIMER_ORDER.index(t) if t in TIMER_ORDER else len(TIMER_ORDER), t))


def sort_providers(providers) -> list[str]:
    """Distinct provider names in PROVIDER_RANK order (others after, alphabetically)."""
    rank = {p: i for i, p in enumerate(PROVIDER_RANK)}
    return sorted(set(providers), key=lambda p: (rank.get(p, len(rank)), p))


def pass_label(pass_: str) -> str:
    return PASS_LABEL.get(pass_, pass_)


def has_text(x) -> bool:
    """True for a non-empty text cell (not None, NaN or blank)."""
    return isinstance(x, str) and x.strip() != "" and x.strip().lower() != "nan"


def isnan(x) -> bool:
    """True for None and NaN (numbers or numeric text); False for any other text."""
    try:
        return x is None or math.isnan(float(x))
    except (TypeError, ValueError):
        return False


def fmt_int(x) -> str:
    return MISSING if isnan(x) else str(int(x))


def fmt_config(column: str, value) -> str:
    """A config cell: integer columns as whole numbers, dtype as text."""
    return fmt_int(value) if column in schema.INT_CONFIG_COLUMNS else str(value)


def config_item(column: str, value) -> str:
    """'T=4096' for a caption or label. A configuration column added later (schema.CONFIG_DEFAULTS:
    depth_grad, Tq, S) at its default gives '' (not shown); depth_grad=0 reads 'depth detached'."""
    default = schema.CONFIG_DEFAULTS.get(column)
    if default is not None and not isnan(value) and float(value) == default:
        return ""
    if column == "depth_grad" and not isnan(value) and float(value) == 0:
        return "depth detached"
    return f"{column}={fmt_config(column, value)}"


def config_text(items) -> str:
    """', '.join of the non-empty config_item texts of (column, value) pairs."""
    return ", ".join(t for t in (config_item(c, v) for c, v in items) if t)


def gpu_slug(gpu: str) -> str:
    """A file-name part for a GPU name, its vendor word dropped: 'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3'."""
    slug = re.sub(r"[^a-z0-9]+", "-", str(gpu).lower()).strip("-")
    return re.sub(r"^(nvidia|amd|intel)-(?=.)", "", slug) or "unnamed-gpu"


def sort_gpus(gpus) -> list[str]:
    """Distinct GPU names (blank included, as ''), sorted."""
    return sorted({str(g).strip() if has_text(g) else "" for g in gpus})


def gpu_suffix(gpu: str) -> str:
    """' on <GPU>' after a heading that names its GPU."""
    return f" on {gpu if gpu else 'an unnamed GPU'}"


def fmt_num(x, spec: str, suffix: str = "") -> str:
    return MISSING if isnan(x) else f"{float(x):{spec}}{suffix}"


def fmt_ci(ratio, lo, hi, spec: str = ".3f", suffix: str = "") -> str:
    """'1.023 [1.011-1.035]': a ratio with its 95% interval; the ratio alone where the interval is
    missing; MISSING without a ratio."""
    if isnan(ratio):
        return MISSING
    text = f"{float(ratio):{spec}}{suffix}"
    if not isnan(lo) and not isnan(hi):
        text += f" [{float(lo):{spec}}-{float(hi):{spec}}]"
    return text


def fmt_best(ratio, best) -> str:
    """'1.81 (fa4)': a ratio to the fastest attention of the point, naming it."""
    if isnan(ratio):
        return MISSING
    return f"{float(ratio):.2f}" + (f" ({best})" if has_text(best) else "")


def fmt_us(ms, status="") -> str:
    """A time in microseconds (ms given) with 1 decimal; a failed cell shows its status."""
    if isnan(ms):
        return status if isinstance(status, str) and status and status != schema.OK else MISSING
    return f"{float(ms) * 1e3:.1f}"


def fmt_ms(ms, status="") -> str:
    """ms with 3 decimals; a measured-but-failed cell shows its status (oom, skipped, error)."""
    if isnan(ms):
        return status if isinstance(status, str) and status and status != schema.OK else MISSING
    return f"{float(ms):.3f}"
