"""Where a model step's time goes: one torch.profiler trace per variant, summed by category.

The decoder labels its forward work with profiler ranges (`models.decoder.LABELS`: attention,
depth-kv, projections, ffn, residual-mix, lm-head) and the step its optimizer ('optimizer').
A forward range's time is the device time of the kernels launched inside it (CPU time off
CUDA). Backward work runs on autograd's thread outside those ranges: each backward node is
given the label of the forward op it differentiates (the op with the same sequence number,
whose enclosing range names it). Ops that make no node record the sequence number the next node
will take, so of the forward events with one number the last (in time) is the op that made the
node: a detached depth read just before MoDA's call shares its number, and the first event would
give MoDA's backward to 'depth-kv'. What no label claims is 'other'. Rows: schema.PROFILE_COLUMNS.
"""
from __future__ import annotations

import math
from pathlib import Path

from moda_bench import schema

OPTIMIZER = "optimizer"
OTHER = "other"
BACKWARD_PREFIX = "autograd::engine::evaluate_function: "


def _time(event, on_cuda: bool, self_only: bool = False) -> float:
    """An event's time in microseconds: device time of its kernels on CUDA, else CPU time."""
    if on_cuda:
        name = "self_device_time_total" if self_only else "device_time_total"
        legacy = "self_cuda_time_total" if self_only else "cuda_time_total"
        return float(getattr(event, name, None) or getattr(event, legacy, 0.0) or 0.0)
    return float(event.self_cpu_time_total if self_only else event.cpu_time_total)


def _start(event) -> float:
    span = getattr(event, "time_range", None)
    return float(getattr(span, "start", 0.0) or 0.0)


def _label_of(event, labels: set) -> str | None:
    e = event
    while e is not None:
        if e.name in labels:
            return e.name
        e = e.cpu_parent
    return None


def breakdown(events, on_cuda: bool) -> dict:
    """{category: ms} of a profiled step's events (FunctionEvents of torch.profiler)."""
    from torch.autograd import DeviceType

    from moda_bench.models.decoder import LABELS
    labels = set(LABELS) | {OPTIMIZER}
    # host-side events only: kernels and the GPU copies of the labelled ranges are listed beside
    # them, and a host event's device time already holds its kernels'
    events = [e for e in events if e.device_type == DeviceType.CPU]
    out = {c: 0.0 for c in list(LABELS) + [OPTIMIZER]}
    seq_label = {}
    events.sort(key=_start)
    for e in events:
        if e.name in labels and _label_of(e.cpu_parent, labels) is None:
            out[e.name] += _time(e, on_cuda) / 1e3
        seq = getattr(e, "sequence_nr", -1)
        if seq is not None and seq >= 0 and not e.name.startswith(BACKWARD_PREFIX):
            label = _label_of(e, labels)
            if label is not None:
                seq_label[seq] = label   # the last: the op that made the node (see the docstring)
    for e in events:
        if e.name.startswith(BACKWARD_PREFIX) and _label_of(e.cpu_parent, labels) is None:
            label = seq_label.get(getattr(e, "sequence_nr", -1))
            if label is not None:
                out[label] += _time(e, on_cuda) / 1e3
    total = sum(_time(e, on_cuda, self_only=True) for e in events) / 1e3
    out[OTHER] = max(0.0, total - sum(out.values()))
    return out


def profile_step(fn, on_cuda: bool) -> dict:
    """{category: ms} of one call of fn (after one untimed call)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    fn()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    with profile(activities=activities) as prof:
        fn()
        if on_cuda:
            torch.cuda.synchronize()
    return breakdown(prof.events(), on_cuda)


def profile_rows(spec, model, staged: dict, on_cuda: bool) -> list[dict]:
    """PROFILE_COLUMNS rows of every staged, timed variant."""
    rows = []
    for name, st in staged.items():
        if st.row.get("status") != schema.OK:
            continue
        parts = profile_step(st.fn, on_cuda)
        total = sum(parts.values())
        for category, ms in parts.items():
            row = {c: st.row.get(c) for c in schema.PROFILE_COLUMNS if c in st.row}
            row.update(category=category, ms=ms, share=ms / total if total > 0 else math.nan,
                       clock="device" if on_cuda else "cpu")
            rows.append(row)
    return rows


def profile_hook(spec, csv_path: Path):
    """An `on_model` hook for `bench.model.run_model` writing the breakdown to csv_path."""
    def hook(model, staged):
        import pandas as pd
        import torch
        on_cuda = next(model.parameters()).device.type == "cuda"
        rows = profile_rows(spec, model, staged, on_cuda)
        if not rows:
            return
        path = Path(csv_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        new = not path.exists() or path.stat().st_size == 0
        pd.DataFrame(rows, columns=schema.PROFILE_COLUMNS).to_csv(path, mode="a", header=new, index=False)
        if on_cuda:
            torch.cuda.synchronize()
    return hook
