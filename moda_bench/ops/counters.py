"""Arrival counters of one-launch reductions: int32 buffers that are 0 between calls.

Owns `arrival_counters` (and `scratch`, the partials' buffer kept the same way), shared by the kernels whose programs write partial results and whose
last-arriving program of a group sums them (decode's fused combine, the MoDA backward's split
key-major pass): every program adds 1 to its group's counter after its partial is stored, the one
that sees the count reach the group's size sums the partials and puts the counter back to 0. So a
buffer is reused without a memset, and a call allocates nothing once its buffer exists.
"""
from __future__ import annotations

import torch


def stream_state(device) -> tuple:
    """(the current stream's id on device, whether it is capturing a CUDA graph); (0, False) off CUDA.
    The raw stream handle is read as Triton's launcher reads it (a few us less than a Stream object)."""
    if device.type != "cuda":
        return 0, False
    idx = device.index if device.index is not None else torch.cuda.current_device()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    stream = raw(idx) if raw is not None else torch.cuda.current_stream(idx).cuda_stream
    return stream, torch.cuda.is_current_stream_capturing()


def scratch(cache: dict, device, n: int, dtype=torch.float32):
    """n elements of `dtype`, contents undefined, kept in `cache` by (device, stream, n) as
    `arrival_counters` keeps its counters (a capture takes the "graph" buffer an eager call made,
    else a fresh one, not cached): for partial results that the same launch writes before it
    reads them, so a call allocates nothing once its buffer exists. Buffers are not dropped (a
    captured graph may hold one): one a size a stream."""
    return _cached(cache, device, ("scratch", n, dtype), lambda: torch.empty(n, device=device, dtype=dtype))


def arrival_counters(cache: dict, device, n: int):
    """n int32 counters, all 0 on entry, from `cache` (the caller's dict: one per kernel family).

    Eager calls: a buffer per (device, current stream, n), made zeroed by the first call. Two
    calls in flight at once must not share one, hence the stream in the key: calls on one
    stream run one after another, calls on different streams get different buffers.
    CUDA graphs: a capture takes the (device, "graph", n) buffer, made zeroed (outside any
    capture) by the first eager call of that n on any stream, so the usual warm-up before a
    capture (the graph timer's, on a side stream, while torch.cuda.graph captures on a stream of
    its own) leaves the graph one kernel and no memset; replays leave it zero. Graphs of one n
    share it: replay them one after another (one stream), not concurrently; they never share it
    with an eager call. A capture with no eager call of its n before gets a fresh buffer zeroed
    inside the graph (a fill node before the kernel, correct at every replay), not cached:
    a buffer whose zeroing was only captured is 0 only after its graph's first replay."""
    return _cached(cache, device, n, lambda: torch.zeros(n, device=device, dtype=torch.int32))


def _cached(cache: dict, device, key, make):
    stream, capturing = stream_state(device)
    dev = str(device)
    if capturing:
        buf = cache.get((dev, "graph", key))
        return buf if buf is not None else make()
    buf = cache.get((dev, stream, key))
    if buf is None:
        buf = cache[(dev, stream, key)] = make()
        if (dev, "graph", key) not in cache:
            cache[(dev, "graph", key)] = make()
    return buf
