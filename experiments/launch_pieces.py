"""The host cost of MoDA's kept launches, piece by piece, on a GPU host (issue 21's eager T=1024 row):
after one eager fwd+bwd has filled the launch caches, each of its three launches (the descriptor
forward, the dq pass, the key-major pass) is issued again N times from what that call recorded:

  full        `CachedLaunch.__call__` with a cache hit (what an eager call pays a launch)
  expand      `TensorMaps.launch` (or `ck.run` without tensor maps): the arguments expanded, then
              the C launcher
  C launcher  Triton's C launcher alone with the expanded arguments recorded once (argument parsing,
              `cuLaunchKernelEx`)

beside the same pieces of a two-argument kernel (the floor of any Triton launch here), an ATen op
with one kernel (`torch.add(..., out=)`: the dispatcher and `cudaLaunchKernel`), an allocation like
the call's (`torch.empty_like(q)`), and the host-only helpers every launch calls. Launches are issued
in batches of 50 with the GPU drained between batches, so the queue never fills and the clock reads
the host's issue time only. A diagnosis tool: it writes no rows.

    PYTHONPATH=$PWD python3 experiments/launch_pieces.py [--T 1024] [--n 2000]
"""
from __future__ import annotations

import argparse
import time

import torch
import triton
import triton.language as tl

import moda_bench.kernels.launch as launch
from moda_bench.kernels.moda import moda_attention
from host_probe import probe_inputs, shape_args  # tools/ is on sys.path when this file runs

CLOCK = time.perf_counter
SEEN: dict = {}  # CachedLaunch -> (key, grid, args, meta) of its last call
PLAIN: list = []  # CachedLaunch.__call__ as the package defines it (record() wraps it)


@triton.jit
def _two(X, a0, N: tl.constexpr):
    tl.store(X + tl.program_id(0), a0)


def issue_us(fn, n: int, batch: int = 50) -> float:
    """Host microseconds a call of fn, issued in batches with the GPU drained between them."""
    fn()
    done, tot = 0, 0.0
    while done < n:
        torch.cuda.synchronize()
        t0 = CLOCK()
        for _ in range(batch):
            fn()
        tot += CLOCK() - t0
        done += batch
    torch.cuda.synchronize()
    return 1e6 * tot / done


def host_us(fn, n: int) -> float:
    """Microseconds a call of a host-only fn."""
    fn()
    t0 = CLOCK()
    for _ in range(n):
        fn()
    return 1e6 * (CLOCK() - t0) / n


def record() -> None:
    call = launch.CachedLaunch.__call__
    PLAIN.append(call)

    def rec(self, key, grid, args, meta):
        SEEN[self] = (key, grid, args, meta)
        return call(self, key, grid, args, meta)
    launch.CachedLaunch.__call__ = rec


def pieces(cl, n: int) -> dict:
    """The three pieces of one recorded launch of CachedLaunch cl (us a launch)."""
    key, grid, args, meta = SEEN[cl]
    dev, stream = launch._current_stream()
    ck, tail, maps = cl.kernels[(dev, key)]
    gx, gy, gz = (tuple(grid) + (1, 1))[:3]
    full = issue_us(lambda: PLAIN[0](cl, key, grid, args, meta), n)
    if maps is None:
        expand = issue_us(lambda: ck.run(gx, gy, gz, stream, ck.function, ck.packed_metadata, None, None, None,
                                         *args, *tail), n)
        raw = expand
    else:
        expand = issue_us(lambda: maps.launch(gx, gy, gz, stream, ck, args, tail), n)
        got = []
        inner = maps.raw
        maps.raw = lambda *a: got.append(a)
        maps.launch(gx, gy, gz, stream, ck, args, tail)
        maps.raw = inner
        raw_args = got[0]
        raw = issue_us(lambda: inner(*raw_args), n)
    return {"full": full, "expand": expand, "C launcher": raw, "args": len(args) + len(tail)}


def main() -> None:
    p = shape_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    p.add_argument("--n", type=int, default=2000)
    a = p.parse_args()
    x = probe_inputs(a)
    q, k, v, kd, vd, do = (x[n] for n in ("q", "k", "v", "k_depth", "v_depth", "do"))
    record()
    for _ in range(3):
        moda_attention(q, k, v, kd, vd).backward(do)
    torch.cuda.synchronize()
    print(f"host us a launch, {a.n} issued in batches of 50 on a drained GPU (T={a.T}, G={a.G}, L={a.L})")
    print(f"  {'kernel':28s} {'args':>5s} {'full':>8s} {'expand':>8s} {'C launcher':>11s}")
    for cl in SEEN:
        if (launch._current_stream()[0], SEEN[cl][0]) not in cl.kernels:
            print(f"  {cl.fn.__name__:28s} not kept (Triton's own path)")
            continue
        try:
            r = pieces(cl, a.n)
        except Exception as e:  # a launcher laid out otherwise: say so, go on
            print(f"  {cl.fn.__name__:28s} failed: {type(e).__name__}: {str(e).splitlines()[0][:90]}")
            continue
        print(f"  {cl.fn.__name__:28s} {r['args']:5d} {r['full']:8.1f} {r['expand']:8.1f} {r['C launcher']:11.1f}")
    buf = torch.empty(1024, device="cuda", dtype=torch.float32)
    two = launch.CachedLaunch(_two)
    two(("two",), (1,), (buf, 1), lambda: dict(N=1))
    small = torch.empty(64, device="cuda")
    print("  reference pieces (us a call)")
    refs = (("two-argument Triton kernel, kept launch", lambda: two(("two",), (1,), (buf, 1), lambda: dict(N=1))),
            ("torch.add(a, b, out=c), 64 floats", lambda: torch.add(small, small, out=small)),
            ("torch.empty_like(q)", lambda: torch.empty_like(q)),
            ("torch.empty(lse's shape, float32)",
             lambda: torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)))
    for name, fn in refs:
        print(f"  {name:46s} {issue_us(fn, a.n):8.1f}")
    for name, fn in (("launch._current_stream()", launch._current_stream),
                     ("launch._hooks_idle()", launch._hooks_idle)):
        print(f"  {name:46s} {host_us(fn, 20 * a.n):8.2f}")


if __name__ == "__main__":
    main()
