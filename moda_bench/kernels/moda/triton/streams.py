"""The second CUDA stream of MoDA's "stream" placements and moda-fa4's depth launches: `side_stream`,
`Concurrent` (launches on it, ordered after the main stream's work), `run_beside` (two launches
concurrently), and `depth_grid` (the programs of a depth-only launch)."""
from __future__ import annotations

import torch

_SIDE_STREAMS: dict = {}


def side_stream(device, high_priority: bool = False):
    """A second CUDA stream per device (and priority) for the depth kernels (the "stream"
    placement; moda-fa4's depth launches); None off CUDA (the interpreter), where the launches
    simply run in order. high_priority: the device's highest stream priority, so the block
    scheduler places the side kernel's pending programs before those of normal-priority
    kernels already queued (a capped depth launch then gets its slots at once)."""
    if device.type != "cuda":
        return None
    key = (device, bool(high_priority))
    if key not in _SIDE_STREAMS:
        prio = torch.cuda.Stream.priority_range()[1] if high_priority else 0
        _SIDE_STREAMS[key] = torch.cuda.Stream(device, priority=prio)
    return _SIDE_STREAMS[key]


def depth_grid(n_items: int, ctas: int) -> int:
    """Programs of a depth-only launch over n_items work items: one each, or at most `ctas`
    persistent programs (config depth_ctas / bwd_depth_ctas; 0 = no cap)."""
    return max(1, min(n_items, ctas)) if ctas > 0 else max(1, n_items)


class Concurrent:
    """Context: launches inside run on the side stream, ordered after the main stream's work up
    to the creation of this object (not up to entering it: main-stream launches made in
    between run concurrently with the side launches); `join()` makes the main stream wait for
    them. Off CUDA everything runs in order on the current stream."""

    def __init__(self, device, high_priority: bool = False):
        self.side = side_stream(device, high_priority)
        self.main = torch.cuda.current_stream(device) if self.side is not None else None
        if self.side is not None:
            self.ready = torch.cuda.Event()
            self.ready.record(self.main)

    def __enter__(self):
        if self.side is not None:
            self.side.wait_event(self.ready)
            self._ctx = torch.cuda.stream(self.side)
            self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        if self.side is not None:
            self._ctx.__exit__(*exc)
        return False

    def join(self):
        if self.side is not None:
            self.main.wait_stream(self.side)


def run_beside(device, main_launch, side_launch, side_after: bool, high_priority: bool = False) -> None:
    """The "stream" placement: side_launch() on the side stream concurrently with main_launch()
    on the main stream, side_launch issued after main_launch when side_after (else before);
    on return the main stream waits for both."""
    conc = Concurrent(device, high_priority)
    if side_after:
        main_launch()
    with conc:
        side_launch()
    if not side_after:
        main_launch()
    conc.join()
