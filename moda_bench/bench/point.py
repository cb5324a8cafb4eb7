"""One point of a sweep: every provider's inputs, accuracy check and timing, as schema rows.

Staging (per provider, one after another): fresh random inputs (the same seed for every provider
of the point), `provider.prepare`, an accuracy check of a slice against the fp64
`moda_reference`, on CUDA a repeat check (the forward twice more, bitwise; `repeat_err`), and
the callable of the pass. Timing: the staged callables of the point run in
interleaved rounds (A B C A B C ..., each repetition with the L2 flushed; `timing.interleave`)
until every ratio to the baseline has a narrow confidence interval or the per-point cap is
reached, with the GPU's clocks, power, temperature and throttle reasons sampled meanwhile
(`health.GpuSampler`). So drift and power state hit every provider alike, and the ratios and
their intervals come from paired rounds of one process:

- ratio_to_fa2 (+ _lo/_hi): against the `fa2` provider;
- ratio_to_best (+ _lo/_hi): against the fastest sequence-only provider of the point
  (`best_provider`: fa2, fa4, cudnn or fa2-triton, whichever was fastest here).

A custom `timer(fn, grad_to_none=, warmup_ms=, rep_ms=) -> dict` (tests, the naive ablation
rung) times each provider on its own instead; its ratios then have no interval.
"""
from __future__ import annotations

import gc
import json
import math
from dataclasses import dataclass, replace
from typing import Callable, Optional

from moda_bench import schema

# ||out - ref|| / ||ref|| above which a row is marked 'error' (bf16/fp16 kernels vs fp64 reference)
ACCURACY_TOL = {"bfloat16": 4e-2, "float16": 1e-2, "float32": 1e-3}
CHECK_LEN = 512  # positions of batch 0 compared with the reference


@dataclass(frozen=True)
class TimingOptions:
    """How the rows of a point are timed.

    timer: 'eager' (host-inclusive: launches count) or 'graph' (CUDA-graph replays: device time).
    min_samples: repetitions every provider gets at least (never one sample).
    warmup_ms: warm-up per provider; min_time_ms: GPU time each provider is sampled at least.
    ci_tol: stop when every ratio's 95% interval is within +-ci_tol of it; max_time_s: the
    per-point cap (min_samples is honoured even past it).
    """

    timer: str = "eager"
    min_samples: int = 10
    warmup_ms: float = 25.0
    min_time_ms: float = 100.0
    ci_tol: float = 0.01
    max_time_s: float = 60.0


def torch_dtype(name: str):
    import torch
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dt


def check_accuracy(forward: Callable, inputs: dict, pass_: str, n: int = CHECK_LEN,
                   reference: Optional[Callable] = None) -> float:
    """Max ||err|| / ||ref|| over the output slice out[0, :n] and, unless pass_ == 'fwd', the
    gradients of that slice of every input, against `reference(q, k, v, k_depth, v_depth)` in
    float64 (default moda_reference; Depth-Attention passes its own, whose prefix is exact too).

    Exact for a prefix: causal attention of positions < n reads only keys < n and their own
    depth entries; backward uses do zeroed outside batch 0 / positions < n, so the prefix
    gradients of q, k, v, k_depth, v_depth equal the reference gradients of the sliced problem.
    Costs one extra forward (+ backward) of the provider. Leaves .grad cleared.
    """
    import torch

    from moda_bench.kernels.moda import moda_reference
    from moda_bench.timing import grad_inputs, max_rel_err

    names = [k for k in ("q", "k", "v", "k_depth", "v_depth") if inputs.get(k) is not None]
    leaves = grad_inputs(inputs)
    for t in leaves:
        t.grad = None
    n = min(n, inputs["q"].shape[1])
    sl = {k: inputs[k][:1, :n].detach().double().requires_grad_(pass_ != "fwd") for k in names}
    with torch.enable_grad() if pass_ != "fwd" else torch.no_grad():
        out = forward()
        args = [sl.get(k) for k in ("q", "k", "v", "k_depth", "v_depth")]
        ref = moda_reference(*args, out_dtype=torch.float64) if reference is None else reference(*args)
    errs = [max_rel_err(out[:1, :n].detach(), ref.detach())]
    if pass_ != "fwd":
        do = inputs["do"]
        do_slice = torch.zeros_like(do)
        do_slice[:1, :n] = do[:1, :n]
        out.backward(do_slice)
        ref.backward(do[:1, :n].double())
        for k in names:
            t = inputs[k]
            if t.requires_grad:
                errs.append(max_rel_err(t.grad[:1, :n], sl[k].grad))
            elif t.grad is not None:   # a detached input (depth_grad off) must receive no gradient
                errs.append(math.nan)
        for t in leaves:
            t.grad = None
    del out, ref
    return max(errs) if not any(math.isnan(e) for e in errs) else math.nan


def repeat_error(forward: Callable, device: str) -> float:
    """0.0 when two calls of `forward` (no grad) give bitwise equal outputs, else ||b - a|| /
    ||a|| over the whole output; NaN off CUDA (the interpreter runs programs one by one, so a
    race between threads cannot show there). The accuracy check reads a prefix of positions
    against fp64 and cannot see a few wrong rows elsewhere, as moda-fa4's old in-place merge
    showed (docs/DESIGN.md, "The merge route")."""
    if not str(device).startswith("cuda"):
        return math.nan
    import torch

    from moda_bench.timing import max_rel_err
    with torch.no_grad():
        a = forward()
        b = forward()
    a, b = (x[0] if isinstance(x, (tuple, list)) else x for x in (a, b))
    return 0.0 if torch.equal(a, b) else max_rel_err(b, a)


def short_error(exc: BaseException, limit: int = 300) -> str:
    """'Type: first line of the message', at most `limit` characters (a row's reason)."""
    msg = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {msg[0] if msg else ''}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def release(device: str) -> None:
    gc.collect()
    if str(device).startswith("cuda"):
        import torch
        torch.cuda.empty_cache()


@dataclass
class Staged:
    """A provider ready to time: its row (accuracy checked), the pass callable and its leaves."""

    row: dict
    fn: Callable[[], object]
    grads: list
    flops: float
    work: object = None    # floor.Work of the pass
    rates: object = None   # floor.Rates of the run


def stage(provider, point, pass_: str, row: dict, *, device: str, chunk: Optional[int], seed: int,
          check_len: int, rates=None, shared: Optional[dict] = None) -> Optional[Staged]:
    """Inputs, prepare, accuracy check and the pass callable; fills row (None when the accuracy
    check failed: the row is then an 'error'). Training providers get `timing.make_inputs` (depth
    K/V detached when the point's depth_grad is off), decode providers the decode inputs.
    `shared` (a point's dict): training inputs of one depth count are made once and shared by the
    providers that take them (the same seed made them equal anyway; a copy each would hold the
    point's depth tensors once per provider: at large L several providers' copies fill an 80 GB
    GPU, and the allocator's retries slow some providers and not others)."""
    import torch

    from moda_bench.floor import Rates, row_work
    from moda_bench.timing import grad_inputs, make_inputs, make_pass_fn

    on_cuda = str(device).startswith("cuda")
    if on_cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    L_eff = provider.depth_entries(point)
    dtype = torch_dtype(point.dtype)
    if provider.op == "decode":
        from moda_bench.bench.decode_providers import check_decode_accuracy, make_decode_inputs
        inputs = make_decode_inputs(point, L_eff, device=device, seed=seed, dtype=dtype)
    else:
        key = (L_eff, str(dtype), pass_ != "fwd", bool(point.depth_grad), seed)
        if shared is not None and key in shared:
            inputs = dict(shared[key])
        else:
            inputs = make_inputs(point.B, point.T, point.Hq, point.Hk, point.d, L_eff, dtype=dtype,
                                 device=device, requires_grad=pass_ != "fwd", seed=seed)
            if not point.depth_grad:
                for name in ("k_depth", "v_depth"):
                    if inputs[name] is not None:
                        inputs[name].requires_grad_(False)
            if shared is not None:
                shared[key] = dict(inputs)
    prepared = provider.prepare(inputs, point, chunk)
    if prepared.do is not None:
        inputs = dict(inputs, do=prepared.do)
    row.update(impl_detail=prepared.impl_detail, depth_utilization=prepared.depth_utilization,
               config=json.dumps(prepared.config, sort_keys=True) if prepared.config else "")
    if provider.op == "decode":
        err = check_decode_accuracy(prepared.forward, inputs)
    else:
        err = check_accuracy(prepared.forward, inputs, pass_, check_len, provider.reference)
    row["max_rel_err"] = err
    row["repeat_err"] = repeat_error(prepared.forward, device)
    fn = make_pass_fn(prepared.forward, inputs, pass_)
    if on_cuda:
        fn()  # one call of the timed pass, so the peak includes what it allocates
        torch.cuda.synchronize()
        row["peak_mem_mb"] = torch.cuda.max_memory_allocated() / 2**20
    tol = ACCURACY_TOL.get(point.dtype, 1e-3)
    if not err <= tol:
        ref = "the reference" if (provider.reference or provider.op == "decode") else "moda_reference"
        what = ("non-finite output (NaN/Inf)" if not math.isfinite(err) else f"max_rel_err={err:.3g} > {tol:g}")
        row.update(status=schema.ERROR, reason=f"accuracy: {what} vs {ref}")
        return None
    work = row_work(provider.kind, pass_, B=point.B, T=point.T, Hq=point.Hq, Hk=point.Hk, d=point.d,
                    L=L_eff, S=L_eff if provider.depth_axis == "S" else 0, Tq=point.Tq, dtype=point.dtype,
                    depth_grad=point.depth_grad)
    return Staged(row, fn, grad_inputs(inputs), work.flops, work, rates or Rates())


def guarded(row: dict, device: str, work: Callable[[], object]):
    """work() with a provider's failures turned into the row's status (skipped / oom / error)."""
    import torch

    from moda_bench.bench.providers import ProviderSkip
    try:
        return work()
    except ProviderSkip as exc:
        row.update(status=schema.SKIPPED, reason=str(exc))
    except torch.cuda.OutOfMemoryError as exc:
        row.update(status=schema.OOM, reason=short_error(exc))
    except Exception as exc:  # any failure of one provider must not stop the sweep
        row.update(status=schema.ERROR, reason=short_error(exc))
    release(device)
    return None


def finish(staged: Staged, timing: dict) -> None:
    row = staged.row
    row.update({k: v for k, v in timing.items() if k in row or k in schema.COLUMNS})
    row["samples"] = timing.get("n_samples", row.get("samples"))
    ms = row["median_ms"]
    row["tflops"] = staged.flops / (ms * 1e9) if ms and ms > 0 else math.nan
    if staged.work is not None:
        from moda_bench.floor import Rates, floor_columns
        row.update(floor_columns(staged.work, staged.rates or Rates(), ms))
    row["status"] = schema.OK


def time_sequential(staged: dict, timer: Callable, opts: TimingOptions) -> None:
    """Each staged provider timed on its own by `timer` (its median/p20/p80, and samples if given)."""
    for st in staged.values():
        t = guarded(st.row, "", lambda st=st: timer(st.fn, grad_to_none=st.grads or None,
                                                    warmup_ms=opts.warmup_ms, rep_ms=opts.min_time_ms))
        if t is not None:
            finish(st, dict(t, timer=t.get("timer", "custom")))


def time_interleaved(staged: dict, opts: TimingOptions, device_index: Optional[int]) -> Optional[object]:
    """The staged providers in interleaved rounds (those whose sampler fails get an error row);
    the `timing.Interleaved` result, or None when nothing could be timed. GPU state columns go
    into every timed row."""
    from moda_bench import health, timing

    samplers, est = {}, 0.0
    for name, st in staged.items():
        s = guarded(st.row, "cuda", lambda st=st: timing.make_sampler(st.fn, opts.timer, st.grads or None))
        if s is None:
            continue
        e = guarded(st.row, "cuda", lambda s=s: timing.warmup(s, opts.warmup_ms / 1e3))
        if e is not None:
            samplers[name], est = s, max(est, e)
    if not samplers:
        return None
    from moda_bench.bench.providers import BASELINE
    baseline = BASELINE if BASELINE in samplers else next(iter(samplers))
    reps = timing.choose_reps(est)
    rule = timing.RoundRule(min_samples=opts.min_samples, min_rounds=max(2, -(-opts.min_samples // reps)),
                            ci_tol=opts.ci_tol, min_time_s=opts.min_time_ms / 1e3 * len(samplers),
                            max_time_s=opts.max_time_s)
    running = [None]  # the provider whose repetitions run now: each GPU poll is tagged with it
    retries0 = alloc_retries(device_index)
    with health.GpuSampler(device_index or 0, tag=lambda: running[0]) as gpu:
        result = timing.interleave(samplers, baseline=baseline, reps=reps, rule=rule, timer=opts.timer,
                                   on_switch=lambda name: running.__setitem__(0, name))
    retries = alloc_retries(device_index) - retries0
    state = gpu.summary()
    throttled = point_throttle(state.get("throttle"))
    for name in samplers:
        finish(staged[name], result.measurements[name].row())
        staged[name].row.update({c: state.get(c) for c in health.GPU_COLUMNS if c in schema.COLUMNS})
        own = gpu.summary(tagged=name)
        staged[name].row.update({c: own.get(src) for c, src in health.OWN_COLUMNS.items()})
        staged[name].row["alloc_retries"] = retries
        if throttled:
            staged[name].row["health"] = mark_health(staged[name].row.get("health"), throttled)
        if retries > 0:
            staged[name].row["health"] = degrade(
                staged[name].row.get("health"),
                f"memory: {retries} allocator retries while this point was timed (the providers' inputs fill the "
                "GPU; time fewer providers per sweep)")
    return result


def alloc_retries(device_index: Optional[int]) -> int:
    """The CUDA caching allocator's cumulative cudaMalloc retries on the device (0 off CUDA)."""
    import torch
    if not torch.cuda.is_available():
        return 0
    return int(torch.cuda.memory_stats(device_index or 0).get("num_alloc_retries", 0))


def point_throttle(throttle) -> str:
    """The hard throttle reasons (health.HARD_THROTTLE: thermal, hardware slowdown, power brake)
    among those NVML reported while a point was timed, '|'-joined ('' when none)."""
    from moda_bench.health import HARD_THROTTLE
    return "|".join(t for t in str(throttle or "").split("|") if t in HARD_THROTTLE)


def mark_health(health: Optional[str], throttled: str) -> str:
    """A row's `health` when its point ran throttled: a healthy (or unchecked) run's verdict becomes
    'degraded: clocks throttled during this point: ...'; a worse verdict is kept as it is."""
    return degrade(health, f"clocks throttled during this point: {throttled}")


def degrade(health: Optional[str], why: str) -> str:
    """'degraded: <why>' for a healthy (or unchecked) verdict; a degraded one gets '; <why>'
    appended; any other (worse) verdict is kept as it is."""
    text = str(health or "").strip()
    if text in ("", "healthy", "unknown"):
        return f"degraded: {why}"
    if text.startswith("degraded:") and why not in text:
        return f"{text}; {why}"
    return text


def fill_ratios(staged: dict, result, sequence_only: set) -> None:
    """ratio_to_fa2 / extra_time_pct (the overhead over fa2) and ratio_to_best (+ intervals), and
    the paper's extra time (`schema.fill_extra_time`) of every timed row."""
    from moda_bench.bench.providers import BASELINE
    from moda_bench.timing import ratio_ci

    timed = {n: st.row for n, st in staged.items() if st.row.get("status") == schema.OK}
    if not timed:
        return
    seq = [n for n in timed if n in sequence_only]
    best = min(seq, key=lambda n: timed[n]["median_ms"]) if seq else None

    def ratio(name, den):
        if result is not None and name in result.round_medians and den in result.round_medians:
            if name == den:
                return 1.0, 1.0, 1.0
            return ratio_ci(result.round_medians[name], result.round_medians[den])
        r = timed[name]["median_ms"] / timed[den]["median_ms"]
        return r, math.nan, math.nan

    for name, row in timed.items():
        if BASELINE in timed:
            r, lo, hi = ratio(name, BASELINE)
            row.update(ratio_to_fa2=r, ratio_to_fa2_lo=lo, ratio_to_fa2_hi=hi, extra_time_pct=(r - 1) * 100)
        if best is not None:
            r, lo, hi = ratio(name, best)
            row.update(best_provider=best, ratio_to_best=r, ratio_to_best_lo=lo, ratio_to_best_hi=hi)
    schema.fill_extra_time(timed.values())   # the paper's (M - F) / M against fa2-triton, fa2 and fa4


# what staging writes into a provider's row (copied into the rows of a point's other timers)
STAGE_FIELDS = ("impl_detail", "depth_utilization", "config", "max_rel_err", "repeat_err", "peak_mem_mb")


def run_point(provs, point, pass_: str, rows: list, *, device: str, chunk: Optional[int], seed: int,
              check_len: int, unavailable: dict, opts: TimingOptions, timer: Optional[Callable] = None,
              device_index: Optional[int] = None, on_staged: Optional[Callable] = None, rates=None,
              also: tuple = ()) -> None:
    """Fill `rows` (base rows of the point, one per provider, in provider order): stage every
    provider, then time them (interleaved on CUDA, or each by `timer`), then the ratios and the
    floor columns (at `rates`, floor.Rates; unknown rates leave floor_ms empty). `also`: more
    (opts, timer, rows) timings of the same point (a sweep's other timers), each timed into its
    own rows after the first, from the same staged providers: inputs, preparation and accuracy
    check run once per point, not once per timer."""
    staged, shared = {}, {}
    too_big = None
    if provs and provs[0].op == "decode":   # every provider of the point holds its own inputs at once
        from moda_bench.bench.decode_providers import point_does_not_fit
        too_big = point_does_not_fit(point, [p for p in provs if not unavailable.get(p.name)], device)
    for prov, row in zip(provs, rows):
        if unavailable.get(prov.name):
            row.update(status=schema.SKIPPED, reason=unavailable[prov.name])
        elif too_big:
            row.update(status=schema.SKIPPED, reason=too_big)
        else:
            st = guarded(row, device, lambda prov=prov, row=row: stage(
                prov, point, pass_, row, device=device, chunk=chunk, seed=seed, check_len=check_len, rates=rates,
                shared=shared))
            if st is not None:
                staged[prov.name] = st
        if on_staged is not None:
            on_staged(prov)
    sequence_only = {p.name for p in provs if not p.uses_depth}
    first = {p.name: row for p, row in zip(provs, rows)}
    for k, (t_opts, t_timer, t_rows) in enumerate(((opts, timer, rows),) + tuple(also)):
        if k == 0:
            now = staged
        else:  # the same staged callables, writing into this timer's rows
            mine = {p.name: row for p, row in zip(provs, t_rows)}
            for name, row in mine.items():
                src = first[name]
                if name in staged:
                    row.update({f: src[f] for f in STAGE_FIELDS if f in src})
                else:
                    row.update({f: src[f] for f in STAGE_FIELDS + ("status", "reason") if f in src})
            now = {name: replace(st, row=mine[name]) for name, st in staged.items()}
        result = None
        if t_timer is not None or not str(device).startswith("cuda"):
            time_sequential(now, t_timer, t_opts)
        elif now:
            result = time_interleaved(now, t_opts, device_index)
        fill_ratios(now, result, sequence_only)
        result = None
        release(device)  # this timer's samplers (CUDA graphs and their memory) go before the next's
    staged.clear()
    shared.clear()
    release(device)
