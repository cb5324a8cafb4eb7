"""The report's own vocabulary, shared by its tables, Markdown and figures: which providers play
which role, display orders and labels, cell formatting, and `ReportError`.

Everything that is the results schema (columns, row key, axes, pass names) comes from
`moda_bench.schema`; this module holds only what the report adds on top of it.
"""
from __future__ import annotations

import math

from moda_bench import schema

ENV_COLUMNS = ["gpu", "torch_version", "triton_version", "git_commit"]
RUN_COLUMNS = ENV_COLUMNS + ["timestamp"]
PAPER_AXES = ["T", "G", "L"]                      # the axes the paper swept (schema.AXES adds C)
ABLATION_SWEEP = "ablation"
LADDER = ["naive-torch", "flash-compatible", "chunk-aware", "group-aware", "batched-tiles", "ours", "moda"]
FA2_PROVIDERS = ("fa2", "fa2-triton")             # first present is the FA2 baseline unless chosen
MODA_PROVIDERS = ("moda", "ours")
ALWAYS_SHOWN = ["cudnn", "flex"]                  # efficiency columns present even when not measured
CEILING_PROVIDER = "matmul"
DEFAULT_CEILING_TFLOPS = 784.0                    # bf16 matmul on the project's H100 (spec section 5)
PASS_ORDER = ["fwdbwd", "fwd", "bwd"]             # display order of schema.PASSES: the paper's pass first
PASS_LABEL = {"fwdbwd": "fwd+bwd", "fwd": "fwd", "bwd": "bwd"}
MISSING = "-"


class ReportError(Exception):
    """A user-facing problem with the inputs (one line, no traceback)."""


def sort_passes(passes) -> list[str]:
    """Distinct pass names in PASS_ORDER (unknown ones after, alphabetically)."""
    return sorted(set(passes), key=lambda p: (PASS_ORDER.index(p) if p in PASS_ORDER else len(PASS_ORDER), p))


def sort_sweeps(sweeps) -> list[str]:
    """Distinct sweep names in schema.AXES order (other sweeps after, alphabetically)."""
    return sorted(set(sweeps), key=lambda s: (schema.AXES.index(s) if s in schema.AXES else len(schema.AXES), s))


def pass_label(pass_: str) -> str:
    return PASS_LABEL.get(pass_, pass_)


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


def fmt_num(x, spec: str, suffix: str = "") -> str:
    return MISSING if isnan(x) else f"{float(x):{spec}}{suffix}"


def fmt_ms(ms, status="") -> str:
    """ms with 3 decimals; a measured-but-failed cell shows its status (oom, skipped, error)."""
    if isnan(ms):
        return status if isinstance(status, str) and status and status != schema.OK else MISSING
    return f"{float(ms):.3f}"
