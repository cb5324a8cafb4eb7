"""Arrival counters of one-launch reductions: int32 buffers that are 0 between calls.

Owns `arrival_counters` (and `scratch`, the partials' buffer, one a stream grown to fit, and
`scratch_views`, views of that buffer kept for repeat calls: the MoDA backward's row statistics), shared
by the kernels whose programs write partial results and whose last-arriving program of a group
sums them (decode's fused combine, the MoDA backward's split key-major pass): every program adds
1 to its group's counter after its partial is stored, the one that sees the count reach the
group's size sums the partials and puts the counter back to 0. So a buffer is reused without a
memset, and a call allocates nothing once its buffer exists.
"""
from __future__ import annotations

import math

import torch

from moda_bench.kernels.launch import cuda_calls


def stream_state(device) -> tuple:
    """(the current stream's id on device, whether it is capturing a CUDA graph); (0, False) off CUDA.
    The stream's id is its raw handle, read through `launch.cuda_calls`."""
    if device.type != "cuda":
        return 0, False
    current, raw, capturing = cuda_calls()
    return raw(device.index if device.index is not None else current()), capturing()


def scratch(cache: dict, device, n: int, dtype=torch.float32, state=None):
    """n elements of `dtype`, contents undefined: for partial results that the same launch writes
    before it reads them. Eager calls: one buffer per (device, current stream, dtype) in `cache`,
    grown to the largest n asked for (a smaller call takes its first n elements), so a run of
    many shapes holds one buffer a stream, not one a shape; a call allocates nothing once it
    fits. A buffer outgrown is dropped, which is safe for eager work: calls on one stream run in
    order, so the caching allocator reuses its memory only after the queued kernels that read it.
    A CUDA graph capture takes a fresh buffer from the graph's own memory pool (never cached,
    nothing to zero), which its replays keep. state: `stream_state(device)` where the caller has it."""
    stream, capturing = state or stream_state(device)
    if capturing:
        return torch.empty(n, device=device, dtype=dtype)
    key = (str(device), stream, "scratch", dtype)
    held = cache.get(key)  # (buffer, view of the last size asked for: a repeat call makes none)
    if held is None or held[0].numel() < n:
        buf = torch.empty(n, device=device, dtype=dtype)
        held = cache[key] = (buf, buf)
    elif held[1].numel() != n:
        held = cache[key] = (held[0], held[0][:n])
    return held[1]


def arrival_counters(cache: dict, device, n: int, state=None):
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
    a buffer whose zeroing was only captured is 0 only after its graph's first replay.
    state: `stream_state(device)` where the caller has it."""
    stream, capturing = state or stream_state(device)
    dev = str(device)
    if capturing:
        buf = cache.get((dev, "graph", n))
        return buf if buf is not None else torch.zeros(n, device=device, dtype=torch.int32)
    buf = cache.get((dev, stream, n))
    if buf is None:
        buf = cache[(dev, stream, n)] = torch.zeros(n, device=device, dtype=torch.int32)
        if (dev, "graph", n) not in cache:
            cache[(dev, "graph", n)] = torch.zeros(n, device=device, dtype=torch.int32)
    return buf


def scratch_views(cache: dict, device, shapes: tuple, dtype=torch.float32, state=None) -> tuple:
    """Views of the given shapes laid end to end in one `scratch` buffer (its rules: per device and
    current stream, grown to fit; a capture takes fresh memory), contents undefined: for values a
    call writes and reads itself, such as a backward's row statistics. The views of the last shapes
    asked for are kept, so a repeat call allocates nothing and makes no view."""
    state = state or stream_state(device)
    sizes = [math.prod(s) for s in shapes]
    if state[1]:
        return _views(scratch(cache, device, sum(sizes), dtype, state), shapes, sizes)
    key = (str(device), state[0], "views", dtype)
    held = cache.get(key)  # (shapes, their views)
    if held is None or held[0] != shapes:
        held = cache[key] = (shapes, _views(scratch(cache, device, sum(sizes), dtype, state), shapes, sizes))
    return held[1]


def _views(buf, shapes: tuple, sizes: list) -> tuple:
    out, at = [], 0
    for shape, n in zip(shapes, sizes):
        out.append(buf[at:at + n].view(shape))
        at += n
    return tuple(out)
