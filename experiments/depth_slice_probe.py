"""Depth K/V read in place, and the custom ops' host cost (issue 59 items 2 and 3), on a GPU.

GPU ms of one `moda_attention` fwd and fwd+bwd with the depth K/V (a) contiguous, (b) a slice
[:, :, :L] of a (B, T, Lmax, Hk, d) buffer per K and V read in place (the pointer kernels; with a
"tma" config the descriptor forward falls back to the pointer kernel, the descriptor backward
reads the slice through descriptors with its strides), (c) the same slice copied first
(`.contiguous()`, what every call paid before); `moda_attention_into` on the slice with a gradient
buffer, its depth gradients added in the backward kernel (DEPTH_ACC) and after it; then host us
per eager fwd+bwd call through the autograd Function (default) and through the torch custom ops
(`oplib.set_eager_ops(True)`), and, with --compile, a torch.compile(fullgraph=True) call against
eager. Timing: `triton.testing.do_bench` medians (a probe, not the suite's timer).

    python3 experiments/depth_slice_probe.py [--T 2048] [--L 24] [--lmax 48] [--G 4] [--Hk 8] [--d 64] [--compile]
"""
from __future__ import annotations

import argparse
import time

import torch
import triton

from moda_bench.kernels import oplib
from moda_bench.kernels.moda import moda_attention
from moda_bench.kernels.moda.triton.accumulate import moda_attention_into


def _fwd_bwd(q, k, v, kd, vd, do):
    out = moda_attention(q, k, v, kd, vd)
    out.backward(do)


def main() -> None:
    ap = argparse.ArgumentParser()
    for name, val in (("B", 1), ("T", 2048), ("G", 4), ("Hk", 8), ("d", 64), ("L", 24), ("lmax", 48)):
        ap.add_argument(f"--{name}", type=int, default=val)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(a.B, a.T, a.G * a.Hk, a.d, device=dev, dtype=dt, requires_grad=True)
    k, v = (torch.randn(a.B, a.T, a.Hk, a.d, device=dev, dtype=dt, requires_grad=True) for _ in range(2))
    bufk, bufv = (torch.randn(a.B, a.T, a.lmax, a.Hk, a.d, device=dev, dtype=dt) for _ in range(2))
    sk, sv = (b[:, :, :a.L].detach().requires_grad_() for b in (bufk, bufv))  # views of the buffers
    ck, cv = sk.detach().contiguous().requires_grad_(), sv.detach().contiguous().requires_grad_()
    do = torch.randn_like(q)
    cases = {"contiguous": lambda: (ck, cv), "slice in place": lambda: (sk, sv),
             "slice copied": lambda: (sk.contiguous(), sv.contiguous())}
    print(f"B={a.B} T={a.T} G={a.G} Hk={a.Hk} d={a.d} L={a.L} of Lmax={a.lmax}, bf16, {torch.cuda.get_device_name()}")
    for name, depth in cases.items():
        fwd = triton.testing.do_bench(lambda: moda_attention(q, k, v, *depth()))
        both = triton.testing.do_bench(lambda: _fwd_bwd(q, k, v, *depth(), do))
        print(f"  {name:15s} fwd {fwd:.4f} ms   fwd+bwd {both:.4f} ms")
    gk, gv = torch.zeros_like(bufk), torch.zeros_like(bufv)
    for label, in_kernel in (("in the kernel", True), ("after the kernel", False)):
        def into(in_kernel=in_kernel):
            out = moda_attention_into(q, k, v, sk, sv, gk[:, :, :a.L], gv[:, :, :a.L], in_kernel=in_kernel)
            out.backward(do)
        print(f"  into, added {label:17s} fwd+bwd {triton.testing.do_bench(into):.4f} ms")
    for label, through in (("autograd Function", False), ("custom ops", True)):
        old = oplib.set_eager_ops(through)
        try:
            for _ in range(10):
                _fwd_bwd(q, k, v, ck, cv, do)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(a.calls):
                _fwd_bwd(q, k, v, ck, cv, do)
            host = (time.perf_counter() - t0) / a.calls * 1e6  # issue time; GPU-bound if near the GPU time
            torch.cuda.synchronize()
            print(f"  eager through {label:18s} {host:.1f} us a fwd+bwd call (issue time)")
        finally:
            oplib.set_eager_ops(old)
    if a.compile:
        compiled = torch.compile(_fwd_bwd, fullgraph=True)
        compiled(q, k, v, sk, sv, do)
        ms = triton.testing.do_bench(lambda: compiled(q, k, v, sk, sv, do))
        print(f"  compiled (fullgraph) slice fwd+bwd {ms:.4f} ms")


if __name__ == "__main__":
    main()
