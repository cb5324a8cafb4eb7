"""Where the host time and the GPU time of one eager MoDA call go at a short T (issue 21's launch
tax): issues N fwd+bwd calls of `moda_attention` (and of SDPA's flash backend, the FA2 peer) back
to back, where the host is slower than the GPU, and prints the host microseconds per call (issue
time over N; the GPU time of the same call under a CUDA graph for scale) and a cProfile of the
moda calls: the functions with the most own time and the most cumulative time.

    python3 experiments/host_probe.py [--T 1024] [--G 8] [--L 64] [--calls 200] [--top 25]
    python3 experiments/host_probe.py --phases      # host us of each step of a call, no profiler
    python3 experiments/host_probe.py --kernels     # GPU us of each kernel of a fwd+bwd (torch.profiler)
    python3 experiments/host_probe.py --variants 'kv_n=32;q_m=32'   # configs against the default, interleaved
    python3 experiments/host_probe.py --variants 'beside=2' --with-fa2   # ... and FA2 in the rounds, ratios against it
    python3 experiments/host_probe.py --engine      # autograd's own host cost: a Python node against a C++ one
    python3 experiments/host_probe.py --cpu-trace   # torch.profiler's CPU events of the moda calls
    python3 experiments/host_probe.py --api         # CUDA API calls and torch ops a call, moda and FA2 (counts, host us)
    python3 experiments/host_probe.py --launch      # cached launches (ops.launch) against Triton's path
    python3 experiments/host_probe.py --desc        # host-side tensor descriptors against device-side ones

--phases times each piece of a call on its own (input checks, config look-up, allocations, the
launches through `moda_fwd` / `moda_bwd`, autograd's share, a bare Triton launch with as many
arguments) without a profiler: one call at a time on an idle GPU (the host's issue time), and N
calls back to back (where a piece's GPU time is longer, the queue fills and that is what shows).
--variants: ';'-separated configs, each a ','-separated list of field=value of `MoDAConfig`
(short names kv_n, kv_m, q_m, q_n, fwd_m for bwd_kv_block_n, bwd_kv_block_m, bwd_q_block_m,
bwd_q_block_n, block_m), timed fwd+bwd (--pass fwd / bwd: the forward or, eager only, the backward
alone) in interleaved rounds against the default, with the graph timer and then the eager one (the
suite's timing: ratios with 95% intervals). A diagnosis tool: its other numbers come from Python's
clock, cProfile and torch.profiler, and none
of it writes the suite's rows.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import math
import pstats
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from moda_bench.host import canary_kernel, pass_node
from moda_bench.kernels.moda import moda_attention
from moda_bench.kernels.moda.config import check_config, resolve_config
from moda_bench.kernels.moda.triton.interface import moda_bwd, moda_fwd
from moda_bench.kernels.moda.validate import check_inputs
from moda_bench.timing import RoundRule, make_inputs, make_pass_fn, time_fn, time_interleaved

SHORT = {"kv_n": "bwd_kv_block_n", "kv_m": "bwd_kv_block_m", "q_m": "bwd_q_block_m", "q_n": "bwd_q_block_n",
         "fwd_m": "block_m", "kv_w": "bwd_kv_warps", "q_w": "bwd_q_warps", "kv_s": "bwd_kv_stages",
         "q_s": "bwd_q_stages", "fwd_n": "block_n", "fwd_w": "num_warps", "fwd_s": "num_stages",
         "chunk": "bwd_kv_chunk", "beside": "bwd_kv_beside", "items": "bwd_depth_items"}


@triton.jit
def _bare2(X, a0, N: tl.constexpr):
    tl.store(X + tl.program_id(0), a0)


def shape_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The probe point's options (--T --G --Hk --L; B = 1, d = 64), shared by the host tools
    (`host_timeline`, `launch_pieces`)."""
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--Hk", type=int, default=8)
    p.add_argument("--L", type=int, default=64)
    return p


def probe_inputs(a) -> dict:
    """The inputs of the point `shape_args` parsed (`timing.make_inputs`: q, k, v, k_depth, v_depth, do)."""
    return make_inputs(1, a.T, a.G * a.Hk, a.Hk, 64, a.L, seed=0)


def per_call_us(fn, calls: int) -> float:
    """Host microseconds a call of fn, issued `calls` times back to back (the GPU drained first)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    return 1e6 * dt / calls


def drained_call_us(fn, calls: int) -> float:
    """Median host microseconds of one call of fn issued on an idle GPU (synchronized before each
    call, outside the timed span): the host's issue time alone. Back to back (`per_call_us`), a
    piece whose GPU time exceeds its host time fills the launch queue and reads the GPU's time."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return 1e6 * sorted(times)[len(times) // 2]


def phases(x, leaves, calls: int) -> None:
    q, k, v, kd, vd, do = (x[n] for n in ("q", "k", "v", "k_depth", "v_depth", "do"))
    shape = check_inputs(q, k, v, kd, vd, need_cuda=True)
    cfg = resolve_config(shape, q.dtype)
    scale = 1.0 / math.sqrt(shape.d)
    qd, kk, vv, kdd, vdd = (t.detach() for t in (q, k, v, kd, vd))
    o, lse = moda_fwd(qd, kk, vv, kdd, vdd, scale, shape, cfg)
    buf = torch.empty(1024, device="cuda", dtype=torch.float32)
    holder = {}

    def fwd_graph():
        for t in leaves:
            t.grad = None
        holder["o"] = moda_attention(q, k, v, kd, vd)

    def fwdbwd():
        for t in leaves:
            t.grad = None
        moda_attention(q, k, v, kd, vd).backward(do)

    kept = moda_attention(q, k, v, kd, vd)  # a graph kept for the backward-only rows

    def bwd_accumulate():  # the engine, moda's backward and AccumulateGrad into fresh .grad
        for t in leaves:
            t.grad = None
        kept.backward(do, retain_graph=True)

    def bwd_grad():  # the same without AccumulateGrad (gradients returned)
        torch.autograd.grad(kept, leaves, do, retain_graph=True)

    grads = [torch.empty_like(t) for t in leaves]
    five = _five_node(grads)
    stub_in = [t.detach().requires_grad_() for t in leaves]

    def stub():  # a Python node of five inputs whose backward returns ready gradients: engine + accumulate
        for t in stub_in:
            t.grad = None
        five.apply(*stub_in).backward(do)

    rows = [
        ("check_inputs", lambda: check_inputs(q, k, v, kd, vd, need_cuda=True)),
        ("resolve_config + check_config", lambda: check_config(resolve_config(shape, q.dtype), shape.G)),
        ("torch.empty_like(q)", lambda: torch.empty_like(q)),
        ("bare Triton launch, 32 args", lambda: canary_kernel[(1,)](buf, *range(30), ONE=1)),
        ("bare Triton launch, 2 args", lambda: _bare2[(1,)](buf, 1, N=1)),
        ("moda_fwd (launches + allocs)", lambda: moda_fwd(qd, kk, vv, kdd, vdd, scale, shape, cfg)),
        ("moda_bwd (launches + allocs)", lambda: moda_bwd(do, qd, kk, vv, kdd, vdd, o, lse, scale, shape, cfg)),
        ("moda_bwd, key-major pass after the dq pass",
         lambda: moda_bwd(do, qd, kk, vv, kdd, vdd, o, lse, scale, shape, cfg.replace(bwd_kv_beside=0))),
        ("moda_bwd, key-major pass beside it",
         lambda: moda_bwd(do, qd, kk, vv, kdd, vdd, o, lse, scale, shape, cfg.replace(bwd_kv_beside=1))),
        ("moda_bwd, key-major rows unchunked",
         lambda: moda_bwd(do, qd, kk, vv, kdd, vdd, o, lse, scale, shape, cfg.replace(bwd_kv_chunk=0))),
        ("moda_bwd, key-major rows in 4-tile chunks",
         lambda: moda_bwd(do, qd, kk, vv, kdd, vdd, o, lse, scale, shape, cfg.replace(bwd_kv_chunk=4))),
        ("moda_attention forward (graph kept)", fwd_graph),
        ("moda_attention fwd + backward", fwdbwd),
        ("backward alone (engine + moda_bwd + accumulate)", bwd_accumulate),
        ("backward alone, autograd.grad (no accumulate)", bwd_grad),
        ("five-input Python node fwd+bwd, no kernels", stub),
    ]
    print(f"host us per call ({calls} calls each, no profiler; config: {cfg.fwd_depth}/{cfg.bwd_depth}): "
          "one call on an idle GPU (median), and back to back (mean: the GPU's time where that is longer)")
    for name, fn in rows:
        print(f"  {name:48s} {drained_call_us(fn, calls):8.1f} {per_call_us(fn, calls):8.1f}")


_Same = pass_node()  # the least a Python autograd node can do: pass the gradient through


def _five_node(grads):
    """A Python autograd Function over MoDA's five inputs: forward returns a view of the first, backward
    allocates gradients like `grads` and returns them, no kernels (the engine's, the allocations' and
    AccumulateGrad's host cost with moda's input count; fresh tensors, which AccumulateGrad keeps
    without a copy)."""
    class Five(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, *rest):
            return q.view_as(q)

        @staticmethod
        def backward(ctx, g):
            return tuple(torch.empty_like(x) for x in grads)
    return Five


def engine(x, moda, fa2, calls: int) -> None:
    """Host us a call of a fwd+bwd through a Python autograd node and through a C++ one, with the
    engine's device threads (PyTorch's default) and without (`set_multithreading_enabled(False)`:
    every node on the calling thread), and the same for moda and FA2."""
    a = torch.randn(64, device="cuda", requires_grad=True)
    g = torch.ones(64, device="cuda")

    def py_node():
        a.grad = None
        _Same.apply(a).backward(g)

    def cpp_node():
        a.grad = None
        (a * 2).backward(g)

    from moda_bench.health import GpuSampler
    print(f"host us per call ({calls} calls each)        device threads   calling thread   "
          "device threads, GPU sampler polling (25 ms)")
    for name, fn in (("Python node fwd+bwd", py_node), ("C++ node fwd+bwd", cpp_node), ("moda fwd+bwd", moda),
                     ("fa2 fwd+bwd", fa2)):
        on = per_call_us(fn, calls)
        with torch.autograd.set_multithreading_enabled(False):
            off = per_call_us(fn, calls)
        with GpuSampler(torch.cuda.current_device(), interval_s=0.025) as s:
            polled = per_call_us(fn, calls)
        print(f"  {name:38s} {on:10.1f} {off:16.1f} {polled:16.1f} ({len(s.polls)} polls)")


def profiled(fn, activity: str, reps: int = 20, cpu: bool = False):
    """torch.profiler's record of `reps` calls of fn (after three warm-up calls), CPU or CUDA events
    (cpu: the CPU's as well)."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    acts = [getattr(ProfilerActivity, activity)] + ([ProfilerActivity.CPU] if cpu and activity != "CPU" else [])
    with profile(activities=acts) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    return prof


def cpu_trace(fn, reps: int = 20, top: int = 30) -> None:
    prof = profiled(fn, "CPU", reps)
    print(f"--- moda: CPU events of {reps} fwd+bwd calls (us totals over all calls)")
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=top, max_name_column_width=70))


def api_calls(fns: dict, reps: int = 50, top: int = 22) -> None:
    """Per fwd+bwd call of each callable: the CUDA runtime and driver API calls (CUPTI's records:
    launches, event records, stream waits, memsets) and the torch ops, with their count and host
    microseconds a call by own time. The profiler adds its own cost to each record; the counts
    are exact, the times tell the pieces' sizes relative to each other."""
    for name, fn in fns.items():
        prof = profiled(fn, "CUDA", reps, cpu=True)
        rows = [e for e in prof.key_averages() if e.device_type.name == "CPU"]
        rows.sort(key=lambda e: -e.self_cpu_time_total)
        api = [e for e in rows if e.key.startswith("cu")]
        print(f"--- {name}: {sum(e.count for e in api) / reps:.1f} CUDA API calls a call, "
              f"{sum(e.self_cpu_time_total for e in api) / reps:.1f} us; torch ops and API by own host time")
        for e in rows[:top]:
            print(f"  {e.self_cpu_time_total / reps:8.1f} us  x{e.count / reps:<5.1f} {e.key[:90]}")


def kernels(fns: dict, reps: int = 20) -> None:
    for name, fn in fns.items():
        prof = profiled(fn, "CUDA", reps)
        tot = {}
        for e in prof.events():
            if e.device_type.name == "CUDA":
                t = tot.setdefault(e.name, [0, 0.0])
                t[0] += 1
                t[1] += e.device_time if hasattr(e, "device_time") else e.cuda_time
        print(f"--- {name}: GPU us a fwd+bwd by kernel ({reps} calls)")
        for k_, (n, us) in sorted(tot.items(), key=lambda kv: -kv[1][1]):
            print(f"  {us / reps:8.1f} us  x{n // reps:<3d} {k_[:110]}")
        print(f"  {sum(t[1] for t in tot.values()) / reps:8.1f} us  in all")


def interleaved(fns: dict, leaves, baseline: str, timers, max_time: float, width: int) -> None:
    """Print each callable's median and its ratio to `baseline` with the 95% interval, per timer,
    the callables timed in interleaved rounds (the suite's timing)."""
    for timer in timers:
        res = time_interleaved(fns, baseline=baseline, timer=timer, grad_to_none={n: leaves for n in fns},
                               rule=RoundRule(max_time_s=max_time))
        for name in fns:
            m = res.measurements[name]
            r, lo, hi = res.ratios.get(name, (1.0, 1.0, 1.0))
            print(f"  {timer:5s} {name:{width}s} {1e3 * m.median_ms:8.1f} us  x {baseline} {r:.3f} [{lo:.3f}-{hi:.3f}]")


def variants(x, leaves, spec: str, max_time: float = 3.0, pass_: str = "fwdbwd", peer=None) -> None:
    """The default config and each of spec's, interleaved; with peer (a fwd+bwd callable: --with-fa2)
    that too, every ratio then against it."""
    q, k, v, kd, vd, do = (x[n] for n in ("q", "k", "v", "k_depth", "v_depth", "do"))
    shape = check_inputs(q, k, v, kd, vd, need_cuda=True)
    base = resolve_config(shape, q.dtype)
    todo = [("default", base)]
    for item in filter(None, (s.strip() for s in spec.split(";"))):
        kw = {}
        for kv in item.split(","):
            key, val = kv.split("=")
            key = SHORT.get(key.strip(), key.strip())
            cur = getattr(base, key)
            kw[key] = type(cur)(val) if not isinstance(cur, bool) else val.strip() in ("1", "true", "True")
        todo.append((item, base.replace(**kw)))
    print(f"{pass_} at T={shape.T}, G={shape.G}, L={shape.L}, each timer's variants interleaved in one run "
          f"(default: fwd {base.fwd_depth} m{base.block_m}; bwd {base.bwd_depth} q {base.bwd_q_block_m}x"
          f"{base.bwd_q_block_n} kv {base.bwd_kv_block_n}x{base.bwd_kv_block_m})")
    fns = {}
    for name, cfg in todo:
        try:
            fn = make_pass_fn(lambda cfg=cfg: moda_attention(q, k, v, kd, vd, config=cfg), x, pass_)
            fn()
        except Exception as e:  # a config the kernels refuse: say so, go on
            print(f"  {name:40s} failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
            continue
        fns[name] = fn
    for name, fn in fns.items():  # host time: one call on an idle GPU (median), and calls back to back (mean)
        print(f"  host  {name:40s} {drained_call_us(fn, 100):8.1f} us a call alone, "
              f"{per_call_us(fn, 150):8.1f} back to back")
    if peer is not None and pass_ == "fwdbwd":
        fns["fa2"] = peer
    # the backward alone of a forward made outside a capture cannot be captured (autograd's stream)
    interleaved(fns, leaves, "fa2" if "fa2" in fns else "default", ("eager",) if pass_ == "bwd" else ("graph", "eager"),
                max_time, width=40)


def launch_ab(x, leaves, max_time: float = 3.0) -> None:
    """fwd+bwd with MoDA's launches repeated from `CachedLaunch` against Triton's own launch path at
    every call (`set_fast_launch`), host us a call, then interleaved eager and graph timings."""
    from moda_bench.kernels.launch import set_fast_launch
    q, k, v, kd, vd, do = (x[n] for n in ("q", "k", "v", "k_depth", "v_depth", "do"))

    def call(fast: bool):
        def fn():
            set_fast_launch(fast)
            moda_attention(q, k, v, kd, vd).backward(do)
        return fn

    switch_ab({"triton": call(False), "cached": call(True)}, leaves, ("eager", "graph"), max_time)
    set_fast_launch(True)


def switch_ab(fns: dict, leaves, timers, max_time: float) -> None:
    """Two callables that flip a process switch each: host us a call (alternated twice), then
    interleaved timings against the first."""
    for fn in fns.values():
        fn()
    for _ in range(2):  # host time alone, alternated twice
        for name, fn in fns.items():
            print(f"  host  {name:8s} {per_call_us(fn, 150):8.1f} us a call")
    interleaved(fns, leaves, next(iter(fns)), timers, max_time, width=8)


def desc_ab(x, leaves, max_time: float = 3.0, pass_: str = "fwdbwd") -> None:
    """The descriptor kernels with host-side descriptors (`descriptors.set_host_descriptors`) against
    descriptors built by every program on the device: host us a call, then interleaved timings."""
    from moda_bench.kernels.moda.triton.descriptors import set_host_descriptors
    q, k, v, kd, vd = (x[n] for n in ("q", "k", "v", "k_depth", "v_depth"))

    def call(host: bool):
        inner = make_pass_fn(lambda: moda_attention(q, k, v, kd, vd), x, pass_)

        def fn():
            set_host_descriptors(host)
            return inner()
        return fn

    switch_ab({"device": call(False), "host": call(True)}, leaves, ("eager",) if pass_ == "bwd" else ("graph", "eager"),
              max_time)
    set_host_descriptors(True)


def main() -> None:
    p = shape_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--phases", action="store_true", help="host us of each step of a call, no profiler")
    p.add_argument("--kernels", action="store_true", help="GPU us of each kernel of a fwd+bwd")
    p.add_argument("--engine", action="store_true", help="autograd's own host cost, device threads on and off")
    p.add_argument("--cpu-trace", action="store_true", help="torch.profiler CPU events of the moda calls")
    p.add_argument("--api", action="store_true", help="CUDA API calls and torch ops a fwd+bwd, moda and FA2")
    p.add_argument("--max-time", type=float, default=3.0, help="seconds of interleaved rounds a timer (--variants)")
    p.add_argument("--variants", default=None, help="';'-separated configs against the default, interleaved")
    p.add_argument("--with-fa2", action="store_true", help="--variants: FA2 in the rounds too, the ratios against it")
    p.add_argument("--pass", dest="pass_", choices=("fwdbwd", "fwd", "bwd"), default="fwdbwd",
                   help="what --variants times: fwd+bwd, the forward alone or the backward alone")
    p.add_argument("--launch", action="store_true", help="cached launches against Triton's path, interleaved")
    p.add_argument("--desc", action="store_true", help="host-side descriptors against device-side ones, interleaved")
    a = p.parse_args()
    x = probe_inputs(a)
    leaves = [t for k, t in x.items() if k != "do" and t is not None]

    def moda():
        for t in leaves:
            t.grad = None
        moda_attention(x["q"], x["k"], x["v"], x["k_depth"], x["v_depth"]).backward(x["do"])

    def fa2():
        for t in leaves:
            t.grad = None
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            o = F.scaled_dot_product_attention(x["q"].transpose(1, 2), x["k"].transpose(1, 2), x["v"].transpose(1, 2),
                                               is_causal=True, enable_gqa=True)
        o.transpose(1, 2).backward(x["do"])

    if a.phases:
        phases(x, leaves, a.calls)
    if a.kernels:
        kernels({"moda": moda, "fa2": fa2})
    if a.engine:
        engine(x, moda, fa2, a.calls)
    if a.cpu_trace:
        cpu_trace(moda)
    if a.api:
        api_calls({"moda": moda, "fa2": fa2}, top=a.top)
    if a.variants is not None:
        variants(x, leaves, a.variants, a.max_time, a.pass_, fa2 if a.with_fa2 else None)
    if a.launch:
        launch_ab(x, leaves, a.max_time)
    if a.desc:
        desc_ab(x, leaves, a.max_time, a.pass_)
    if a.phases or a.kernels or a.engine or a.cpu_trace or a.api or a.variants is not None or a.launch or a.desc:
        return
    for name, fn in (("moda", moda), ("fa2", fa2)):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(a.calls):
            fn()
        issued = time.perf_counter() - t0
        torch.cuda.synchronize()
        total = time.perf_counter() - t0
        gpu = time_fn(fn, timer="graph").median_ms
        print(f"{name:5s} T={a.T}: host {1e6 * issued / a.calls:7.1f} us per fwd+bwd call issued, "
              f"{1e6 * total / a.calls:7.1f} us with the queue drained; GPU (graph) {1e3 * gpu:7.1f} us")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.calls):
        moda()
    torch.cuda.synchronize()
    prof.disable()
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(a.top)
        print(f"--- moda, by {key} ({a.calls} calls)\n" + "\n".join(out.getvalue().splitlines()[4:]))


if __name__ == "__main__":
    main()
