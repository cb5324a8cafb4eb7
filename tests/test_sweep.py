"""`moda-bench sweep`: planning, provider registry, rows/CSV, baseline maths, plots, CLI, flex.

CPU tests drive run_sweep with device='cpu', fake providers built on moda_reference and an
injected timer (fixed milliseconds per provider), so every number in the CSV is predictable.
"""
from __future__ import annotations

import math
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import torch

from moda_bench import schema
from moda_bench.bench import providers
from moda_bench.bench.point import TimingOptions, check_accuracy
from moda_bench.bench.providers import Prepared, ProviderSkip, UnknownProviderError, register_provider
from moda_bench.bench.runner import Point, plan_points, run_sweep
from moda_bench.bench.spec import RunSpec
from moda_bench.kernels.moda.reference import moda_reference

HAS_CUDA = torch.cuda.is_available()
TINY = Point(T=24, G=2, Hk=2, L=3, B=2, d=16, C=16, dtype="float32")


# ---------------------------------------------------------------------------------------------
# plan_points
# ---------------------------------------------------------------------------------------------

def test_plan_points_paper_defaults():
    base = Point()
    assert (base.B, base.Hk, base.d, base.C, base.dtype) == (1, 8, 64, 64, "bfloat16")
    t = plan_points("T", None, base)
    assert [p.T for p in t] == [4096, 8192, 16384, 32768, 65536]
    assert all((p.G, p.L, p.Hq) == (8, 64, 64) for p in t)
    g = plan_points("G", None, base)
    assert [p.G for p in g] == [2, 4, 8, 16, 32] and [p.Hq for p in g] == [16, 32, 64, 128, 256]
    assert all(p.T == 16384 and p.L == 64 for p in g)
    assert [p.L for p in plan_points("L", None, base)] == [64, 128, 256]
    assert [p.C for p in plan_points("C", None, base)] == list(schema.AXIS_VALUES["C"]) == [16, 32, 64, 128]
    assert base.to_dict() == dict(schema.BASE_POINT, Hq=64)
    assert schema.AXES == ("T", "G", "L", "C", "B", "S", "Tq")
    s = plan_points("S", [0, 4], base)   # an S sweep gives MoDA as many depth entries
    assert [(p.S, p.L) for p in s] == [(0, 0), (4, 4)]
    # 13 rows of the paper's efficiency table = 5 + 5 + 3
    assert sum(len(plan_points(v, None, base)) for v in "TGL") == 13


def test_plan_points_overrides_and_errors():
    base = Point(G=4, Hk=2, d=128, B=3, dtype="float16")
    pts = plan_points("T", [1024, 77], base)
    assert [p.T for p in pts] == [1024, 77]
    assert all((p.G, p.Hk, p.d, p.B, p.dtype, p.Hq) == (4, 2, 128, 3, "float16", 8) for p in pts)
    assert plan_points("L", [0, 5], base)[0].L == 0
    with pytest.raises(ValueError, match="vary must be one of"):
        plan_points("X", None, base)
    with pytest.raises(ValueError, match="integers >= 1"):
        plan_points("T", [0], base)
    with pytest.raises(ValueError, match="repeat"):
        plan_points("G", [2, 2], base)


# ---------------------------------------------------------------------------------------------
# registry
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def registry(monkeypatch):
    """A private copy of the registry (ladder not loaded) that tests may add fakes to."""
    monkeypatch.setattr(providers, "_REGISTRY", dict(providers._REGISTRY))
    monkeypatch.setitem(providers._optional_state, "loaded", True)
    return providers._REGISTRY


def test_builtin_providers_registered():
    names = providers.provider_names()
    for name in providers.DEFAULT_PROVIDERS:
        assert name in names
    assert not providers.get_provider("fa2").uses_depth and not providers.get_provider("cudnn").uses_depth
    assert providers.get_provider("moda").uses_depth and providers.get_provider("flex").uses_depth


def test_unknown_provider_and_duplicates(registry):
    with pytest.raises(UnknownProviderError, match="unknown provider 'fa3'.*known: .*moda"):
        providers.resolve_providers("moda,fa3")
    assert [p.name for p in providers.resolve_providers(" flex, moda,flex ")] == ["flex", "moda"]
    with pytest.raises(ValueError, match="already registered"):
        register_provider("moda")(lambda inputs, point, chunk: None)
    with pytest.raises(UnknownProviderError):
        providers.resolve_providers(" , ")


# ---------------------------------------------------------------------------------------------
# fake providers on the CPU
# ---------------------------------------------------------------------------------------------

MS = {"fa2": 2.0, "fake-moda": 2.5, "fake-seq": 1.5, "fake-wrong": 1.0}


@pytest.fixture
def fakes(registry):
    """fa2 (sequence-only) and fake-moda: moda_reference in float64 on the CPU; fake-wrong is 10% off.
    The injected timer runs the pass once and answers MS[provider whose forward ran]."""
    calls = Counter()

    def reference_provider(name, scale=1.0):
        def prepare(inputs, point, chunk):
            def forward():
                calls[name] += 1
                out = moda_reference(inputs["q"], inputs["k"], inputs["v"], inputs["k_depth"], inputs["v_depth"])
                return out * scale
            return Prepared(forward, impl_detail=f"{name} on cpu", config={"chunk": chunk},
                            depth_utilization=0.5 if inputs["k_depth"] is not None else math.nan)
        return prepare

    register_provider("fa2", uses_depth=False, replace=True)(reference_provider("fa2"))
    register_provider("fake-moda")(reference_provider("fake-moda"))
    register_provider("fake-wrong")(reference_provider("fake-wrong", scale=1.1))
    register_provider("fake-seq", uses_depth=False)(reference_provider("fake-seq"))

    def timer(fn, grad_to_none=None, warmup_ms=None, rep_ms=None):
        before = Counter(calls)
        fn()
        ran = [n for n in calls if calls[n] != before[n]]
        assert len(ran) == 1, ran
        ms = MS[ran[0]]
        return {"median_ms": ms, "p20_ms": 0.9 * ms, "p80_ms": 1.1 * ms}

    return timer


def _run(tmp_path, points, names, timer, pass_="fwdbwd", **kw):
    csv = tmp_path / "sweep_T.csv"
    frame = run_sweep(points, RunSpec(names, pass_), csv, sweep_name="T", device="cpu", timer=timer, progress=False,
                      seed=1, **kw)
    return frame, csv


def test_rows_csv_schema_and_baseline(tmp_path, fakes):
    points = [TINY, TINY.replace(T=40)]
    frame, csv = _run(tmp_path, points, ["fake-moda", "fa2", "fake-seq"], fakes)
    back = pd.read_csv(csv, keep_default_na=False, na_values=[""])
    assert list(back.columns) == schema.COLUMNS
    assert len(back) == 6 and len(csv.read_text().splitlines()) == 7  # header written once
    assert list(back["provider"]) == ["fa2", "fake-moda", "fake-seq"] * 2  # baseline measured first
    assert (back["status"] == "ok").all(), back["reason"].tolist()
    assert list(back["T"]) == [24, 24, 24, 40, 40, 40]
    assert (back["Hq"] == 4).all() and (back["sweep"] == "T").all() and (back["pass"] == "fwdbwd").all()
    by = back.set_index(["T", "provider"])
    assert by.loc[(24, "fa2"), "extra_time_pct"] == 0.0 and by.loc[(24, "fa2"), "ratio_to_fa2"] == 1.0
    assert by.loc[(24, "fake-moda"), "extra_time_pct"] == pytest.approx(25.0)
    assert by.loc[(40, "fake-seq"), "extra_time_pct"] == pytest.approx(-25.0)
    assert by.loc[(40, "fake-moda"), "ratio_to_fa2"] == pytest.approx(1.25)
    assert by.loc[(24, "fake-moda"), "p80_ms"] == pytest.approx(2.75)
    # tflops: useful FLOPs of the pass; sequence-only providers count no depth FLOPs
    p = TINY
    assert by.loc[(24, "fake-moda"), "tflops"] == pytest.approx(
        schema.pass_flops("fwdbwd", p.B, p.Hq, 24, p.d, p.L) / (2.5 * 1e9))
    assert by.loc[(24, "fa2"), "tflops"] == pytest.approx(schema.pass_flops("fwdbwd", p.B, p.Hq, 24, p.d, 0) / 2e9)
    assert by.loc[(24, "fake-moda"), "depth_utilization"] == 0.5
    assert math.isnan(by.loc[(24, "fa2"), "depth_utilization"])
    assert (back["max_rel_err"] < 1e-6).all()  # the fakes are the reference, rounded to float32
    assert back["gpu"].str.len().min() > 0 and back["timestamp"].str.len().min() > 0
    assert by.loc[(24, "fake-moda"), "config"] == '{"chunk": null}'  # not pinned on a T sweep
    assert frame["provider"].tolist() == back["provider"].tolist()
    # a second run appends below (header not repeated)
    _run(tmp_path, [TINY], ["fa2"], fakes)
    assert len(pd.read_csv(csv)) == 7 and csv.read_text().count("sweep,provider") == 1


def test_no_baseline_and_pinned_chunk(tmp_path, fakes):
    frame, _ = _run(tmp_path, [TINY.replace(C=32), TINY.replace(C=16)], ["fake-moda"], fakes, pass_="fwd")
    assert frame["extra_time_pct"].isna().all() and frame["ratio_to_fa2"].isna().all()
    assert frame["config"].tolist() == ['{"chunk": 32}', '{"chunk": 16}']  # C varies -> pinned
    assert frame["C"].tolist() == [32, 16]


def test_wrong_provider_is_flagged(tmp_path, fakes):
    frame, _ = _run(tmp_path, [TINY], ["fa2", "fake-wrong"], fakes, pass_="fwd")
    row = frame.set_index("provider").loc["fake-wrong"]
    assert row["status"] == "error" and "accuracy" in row["reason"]
    assert row["max_rel_err"] == pytest.approx(0.1, rel=1e-6)
    assert frame.set_index("provider").loc["fa2", "status"] == "ok"


def test_skipped_oom_error_rows_and_sweep_continues(tmp_path, fakes):
    register_provider("no-hw", unavailable=lambda device: "needs the imaginary accelerator")(
        lambda inputs, point, chunk: pytest.fail("prepare of an unavailable provider was called"))

    @register_provider("skips")
    def _skips(inputs, point, chunk):
        raise ProviderSkip("C=16 not valid here")

    @register_provider("ooms")
    def _ooms(inputs, point, chunk):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")

    @register_provider("breaks")
    def _breaks(inputs, point, chunk):
        raise RuntimeError("triton compile failed\nlong trace")

    names = ["no-hw", "skips", "ooms", "breaks", "fa2", "fake-moda"]
    frame, csv = _run(tmp_path, [TINY, TINY.replace(T=8)], names, fakes)
    assert len(pd.read_csv(csv)) == 12
    by = frame.set_index(["T", "provider"])
    for T in (24, 8):
        assert by.loc[(T, "no-hw"), "status"] == "skipped"
        assert by.loc[(T, "no-hw"), "reason"] == "needs the imaginary accelerator"
        assert by.loc[(T, "skips"), "status"] == "skipped" and by.loc[(T, "skips"), "reason"] == "C=16 not valid here"
        assert by.loc[(T, "ooms"), "status"] == "oom" and "out of memory" in by.loc[(T, "ooms"), "reason"]
        assert by.loc[(T, "breaks"), "status"] == "error"
        assert by.loc[(T, "breaks"), "reason"] == "RuntimeError: triton compile failed"
        assert by.loc[(T, "fake-moda"), "status"] == "ok"
        assert math.isnan(by.loc[(T, "ooms"), "median_ms"])


def test_builtin_gpu_providers_skip_on_cpu(tmp_path, fakes, registry):
    registry["fa2"] = providers.Provider("fa2", providers._fa2, uses_depth=False, unavailable=providers.needs_cuda)
    frame, _ = _run(tmp_path, [TINY], ["fa2", "cudnn", "flex", "fake-moda"], fakes)
    by = frame.set_index("provider")
    for name in ("fa2", "cudnn", "flex"):
        assert by.loc[name, "status"] == "skipped" and by.loc[name, "reason"]
    assert by.loc["fake-moda", "status"] == "ok" and math.isnan(by.loc["fake-moda", "extra_time_pct"])


def test_interrupted_sweep_keeps_rows(tmp_path, fakes):
    @register_provider("ctrl-c")
    def _interrupt(inputs, point, chunk):
        if point.T == 8:
            raise KeyboardInterrupt
        return providers.get_provider("fake-moda").prepare(inputs, point, chunk)

    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path, [TINY, TINY.replace(T=8)], ["fa2", "ctrl-c"], fakes)
    kept = pd.read_csv(tmp_path / "sweep_T.csv")
    # rows are written per finished point (its providers are timed together): the second point's
    # fa2 row, staged before the interrupt, is not written
    assert kept["provider"].tolist() == ["fa2", "ctrl-c"] and kept["T"].tolist() == [24, 24]


def test_check_accuracy_gradients_of_prefix():
    """Slice check: exact for the prefix (out and all five gradients); a gradient-only bug is caught."""
    from moda_bench.timing import make_inputs
    inputs = make_inputs(2, 20, 4, 2, 8, 3, dtype=torch.float64, device="cpu", seed=3)
    fwd = lambda: moda_reference(*(inputs[k] for k in ("q", "k", "v", "k_depth", "v_depth")))  # noqa: E731
    assert check_accuracy(fwd, inputs, "fwdbwd", n=7) < 1e-12
    assert all(t.grad is None for t in (inputs["q"], inputs["k_depth"]))

    class HalfGradK(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return 0.5 * g

    bad = lambda: moda_reference(inputs["q"], HalfGradK.apply(inputs["k"]), inputs["v"],  # noqa: E731
                                 inputs["k_depth"], inputs["v_depth"])
    assert check_accuracy(bad, inputs, "fwd", n=7) < 1e-12
    assert check_accuracy(bad, inputs, "fwdbwd", n=7) == pytest.approx(0.5, rel=1e-6)


def test_moda_provider_config_pinning():
    from moda_bench.bench.providers import _moda_config
    cfg = _moda_config(Point(G=8, C=32), 64, torch.bfloat16, chunk=32)
    assert cfg.block_m == 32 and cfg.bwd_q_block_m == 32
    assert _moda_config(Point(G=8), 64, torch.bfloat16, chunk=None).block_m == 64
    with pytest.raises(ProviderSkip, match="C=16 not valid for G=32"):
        _moda_config(Point(G=32, C=16), 64, torch.bfloat16, chunk=16)


def test_moda_provider_through_interpreter(tmp_path, registry):
    """The real moda provider (Triton interpreter on CPU): pinned C recorded, accurate."""
    import os
    if os.environ.get("TRITON_INTERPRET") != "1" or HAS_CUDA:
        pytest.skip("CPU interpreter test")
    timer = lambda fn, **kw: (fn(), {"median_ms": 1.0, "p20_ms": 1.0, "p80_ms": 1.0})[1]  # noqa: E731
    pt = Point(T=20, G=2, Hk=1, L=3, d=16, C=16, dtype="float16")
    frame = run_sweep([pt], RunSpec(["moda"], "fwd"), tmp_path / "c.csv", sweep_name="C", device="cpu", timer=timer,
                      progress=False, seed=0)
    row = frame.iloc[0]
    assert row["status"] == "ok", row["reason"]
    assert "block_m=16 (pinned)" in row["impl_detail"] and '"block_m": 16' in row["config"]
    assert row["max_rel_err"] < 5e-3 and 0 < row["depth_utilization"] <= 1
    # the host columns: the process's CPUs, and no host canary without CUDA
    from moda_bench import host
    assert row["host_cpus"] == host.host_cpus()
    assert all(math.isnan(row[c]) for c in schema.HOST_COLUMNS)
    back = pd.read_csv(tmp_path / "c.csv", keep_default_na=False, na_values=[""])
    assert list(back.columns) == schema.COLUMNS and str(back["host_cpus"].iloc[0]) == host.host_cpus()


def test_rows_carry_the_pinned_cpu_and_the_host_canary(tmp_path, fakes, monkeypatch):
    """spec.pin_cpu: the timing process pins itself to item `worker` % len before it times, runs
    the host canary once, and every row carries its numbers and CPU."""
    import os

    from moda_bench import host
    pinned, canaries = [], []
    state = {"cpus": set(range(8))}
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(state["cpus"]), raising=False)
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: (pinned.append(set(cpus)),
                                                                   state.update(cpus=set(cpus))), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(host, "host_canary", lambda: canaries.append(1) or
                        {"host_launch_us": 31.5, "host_op_us": 7.5, "host_autograd_us": 88.0})
    host.forget()
    try:
        spec = RunSpec(["fake-moda", "fa2"], "fwd", pin_cpu=(4, 6))
        frame = run_sweep([TINY, TINY.replace(T=40)], spec, tmp_path / "p.csv", sweep_name="T", device="cpu",
                          timer=fakes, progress=False, seed=1, worker=3)
        run_sweep([TINY], spec, tmp_path / "p.csv", sweep_name="T", device="cpu", timer=fakes, progress=False,
                  seed=1, worker=3)   # a --gpus worker runs one point per call: pinned and measured once
    finally:
        host.forget()
    assert pinned == [{6}] and canaries == [1]
    back = pd.read_csv(tmp_path / "p.csv", keep_default_na=False, na_values=[""])
    assert len(back) == 6 and (back["status"] == "ok").all()
    assert (back["host_cpus"].astype(str) == "6").all() and (frame["host_cpus"] == "6").all()
    assert (back["host_launch_us"] == 31.5).all() and (back["host_op_us"] == 7.5).all()
    assert (back["host_autograd_us"] == 88.0).all()


# ---------------------------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------------------------

def _synthetic_csv(path: Path) -> Path:
    rows = []
    for T, fa2 in [(4096, 2.0), (8192, 7.0), (16384, 27.0), (32768, 118.0)]:
        for prov, ms, status in [("fa2", fa2, "ok"), ("moda", fa2 * 1.1, "ok"), ("cudnn", fa2 * 0.7, "ok"),
                                 ("flex", math.nan, "oom" if T > 8192 else "ok")]:
            ms = fa2 * 3 if prov == "flex" and status == "ok" else ms
            row = {c: None for c in schema.COLUMNS}
            row.update(sweep="T", provider=prov, impl_detail="", T=T, G=8, Hq=64, Hk=8, L=64, B=1, d=64, C=64,
                       dtype="bfloat16", median_ms=ms, p20_ms=ms * 0.98, p80_ms=ms * 1.02, status=status,
                       extra_time_pct=(ms - fa2) / fa2 * 100, gpu="H100", **{"pass": "fwdbwd"})
            rows.append(row)
    pd.DataFrame(rows, columns=schema.COLUMNS).to_csv(path, index=False)
    return path


def test_plot_from_csv_only(tmp_path):
    csv = _synthetic_csv(tmp_path / "sweep_T.csv")
    code = ("import sys; from moda_bench.reports.figures import plot_sweep, infer_x; import pandas as pd; "
            f"p = plot_sweep({str(csv)!r}); print(p); print(infer_x(pd.read_csv({str(csv)!r}))); "
            "bad = [m for m in ('triton', 'torch') if m in sys.modules]; assert not bad, bad")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    png, x = res.stdout.split()
    assert png == str(tmp_path / "sweep_T.png") and x == "T"
    data = Path(png).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_plot_all_failed_and_other_axis(tmp_path):
    from moda_bench.reports.figures import infer_x, plot_sweep
    csv = _synthetic_csv(tmp_path / "s.csv")
    frame = pd.read_csv(csv)
    frame = frame.assign(sweep="custom", status="error")
    frame.to_csv(csv, index=False)
    assert infer_x(frame) == "T"
    out = plot_sweep(csv, tmp_path / "fig.png")
    assert out.read_bytes()[:4] == b"\x89PNG"
    g = frame.assign(T=16384, G=frame["T"] // 2048, sweep="G")
    assert infer_x(g) == "G"


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------

def _app():
    """moda_bench.cli.app when every command module imports, else a local app with `sweep` only."""
    try:
        from moda_bench.cli import app
        return app
    except ImportError:
        import typer

        from moda_bench.cli.sweep import sweep_command
        app = typer.Typer()
        app.command("sweep")(sweep_command)
        app.command("noop")(lambda: None)  # keep `sweep` a subcommand
        return app


def _invoke(*args):
    from typer.testing import CliRunner
    return CliRunner().invoke(_app(), ["sweep", *args], env={"COLUMNS": "160"})


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-GPU message")
def test_cli_without_cuda_exits_with_one_line(tmp_path):
    res = _invoke("--vary", "T", "--values", "1024", "--out", str(tmp_path / "run"))
    assert res.exit_code == 1
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert lines == ["error: moda-bench sweep needs a CUDA GPU (torch.cuda.is_available() is False)"]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("args, message", [
    (["--vary", "X"], "--vary must be one of"),
    (["--vary", "T", "--preset", "paper"], "exactly one of"),
    ([], "exactly one of"),
    (["--preset", "nope"], "unknown preset"),
    (["--preset", "paper", "--values", "1"], "--values applies to --vary"),
    (["--vary", "T", "--values", "1k"], "comma-separated integers"),
    (["--vary", "T", "--providers", "moda,fa3"], "unknown provider 'fa3'"),
    (["--vary", "T", "--dtype", "int8"], "--dtype must be one of"),
    (["--vary", "T", "--pass", "both"], "--pass must be"),
    (["--vary", "G", "--values", "0"], "integers >= 1"),
    (["--vary", "T", "--pin-cpu", "x"], "--pin-cpu must be 'off' or comma-separated CPU ids such as 3 or 3,5,7,9"),
    (["--vary", "T", "--pin-cpu", "2,2"], "--pin-cpu repeats a CPU id"),
    (["--vary", "T", "--pin-cpu", "100000"], "--pin-cpu: CPU 100000 not available to this process (allowed: "),
])
def test_cli_user_errors(args, message):
    res = _invoke(*args)
    assert res.exit_code == 2
    assert message in " ".join(res.output.split()), res.output
    assert "Traceback" not in res.output


def test_cli_end_to_end_with_fake_gpu(tmp_path, monkeypatch, fakes):
    """The whole command (preset, overrides, CSV per sweep, PNG, summary) with run_sweep on the CPU."""
    import moda_bench.bench.runner as runner
    real_run, real_avail = runner.run_sweep, torch.cuda.is_available
    seen = []

    def cpu_run_sweep(points, spec, csv_path, **kw):
        seen.append((kw["sweep_name"], kw["pin_chunk"], spec.timing.warmup_ms, spec.timing.min_time_ms,
                     spec.use_tuned))
        monkeypatch.setattr(torch.cuda, "is_available", real_avail)
        kw.update(device="cpu", timer=fakes, progress=False, seed=0)
        return real_run(points, spec, csv_path, **kw)

    monkeypatch.setattr(runner, "run_sweep", cpu_run_sweep)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(schema, "AXIS_VALUES", {"T": (16, 24), "G": (1, 2), "L": (2, 4), "C": (16,)})
    out = tmp_path / "run"
    res = _invoke("--preset", "paper", "--providers", "fake-moda,fa2", "--T", "20", "--Hk", "1", "--d", "8",
                  "--dtype", "fp32", "--quick", "--no-tuned", "--out", str(out))
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == ["run.json", "sweep_G.csv", "sweep_G.png", "sweep_L.csv",
                                                      "sweep_L.png", "sweep_T.csv", "sweep_T.png"]
    assert [s[0] for s in seen] == ["T", "G", "L"] and all(s[1:] == (None, 5.0, 20.0, False) for s in seen)
    g = pd.read_csv(out / "sweep_G.csv")
    assert g["G"].tolist() == [1, 1, 2, 2] and (g["T"] == 20).all() and (g["dtype"] == "float32").all()
    assert (g["status"] == "ok").all() and g["extra_time_pct"].tolist() == pytest.approx([0, 25, 0, 25])
    assert pd.read_csv(out / "sweep_T.csv")["T"].tolist() == [16, 16, 24, 24]
    assert "sweep G (fwdbwd, float32)" in res.output and "fake-moda" in res.output
    # a second run into the same directory is refused rather than mixed in
    again = _invoke("--vary", "T", "--providers", "fa2", "--out", str(out))
    assert again.exit_code == 2 and "already exists" in again.output


# ---------------------------------------------------------------------------------------------
# flex: block mask, utilisation, numerics
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("T, L, block", [(40, 3, 8), (33, 1, 8), (17, 7, 4), (16, 0, 8), (5, 2, 8)])
def test_flex_block_mask_matches_dense_construction(T, L, block):
    from torch.nn.attention.flex_attention import create_block_mask

    from moda_bench.kernels.moda.flex import moda_block_mask, moda_mask_mod
    mine = moda_block_mask(T, L, device="cpu", block_size=block)
    ref = create_block_mask(moda_mask_mod(T, L), None, None, T, T + T * L, device="cpu", BLOCK_SIZE=block)
    assert torch.equal(mine.to_dense(), ref.to_dense())
    for name in ("kv_num_blocks", "full_kv_num_blocks", "q_num_blocks", "full_q_num_blocks"):
        assert torch.equal(getattr(mine, name), getattr(ref, name)), name


@pytest.mark.parametrize("T, L, block", [(40, 3, 8), (33, 1, 8), (17, 7, 4), (64, 5, 16), (1, 2, 4)])
def test_flex_depth_utilization_counts_visited_tiles(T, L, block):
    from moda_bench.kernels.moda.flex import block_mask_depth_utilization, moda_mask_mod
    q = torch.arange(T)[:, None]
    kv = torch.arange(T + T * L)[None, :]
    allowed = moda_mask_mod(T, L)(0, 0, q, kv)
    assert int(allowed[:, T:].sum()) == T * L  # useful depth logits
    computed = 0
    for i in range(0, T, block):
        for j in range(0, T + T * L, block):
            if allowed[i:i + block, j:j + block].any():
                computed += allowed[i:i + block, max(j, T):j + block].numel()
    assert block_mask_depth_utilization(T, L, block) == pytest.approx(T * L / computed)
    assert block_mask_depth_utilization(1 << 14, 64, 128) == pytest.approx(1 / 128)


def test_flex_eager_forward_matches_reference():
    from moda_bench.kernels.moda.flex import make_moda_flex
    g = torch.Generator().manual_seed(0)
    B, T, Hk, G, d, L = 2, 37, 2, 3, 16, 5
    q = torch.randn(B, T, Hk * G, d, generator=g)
    k, v = torch.randn(B, T, Hk, d, generator=g), torch.randn(B, T, Hk, d, generator=g)
    kd, vd = torch.randn(B, T, L, Hk, d, generator=g), torch.randn(B, T, L, Hk, d, generator=g)
    ref = moda_reference(q, k, v, kd, vd, out_dtype=torch.float64)
    out = make_moda_flex(T, L, device="cpu", block_size=16, compile=False)(q, k, v, kd, vd)
    assert out.shape == q.shape
    assert (out.double() - ref).norm() / ref.norm() < 1e-5
    with pytest.raises(ValueError, match="built for T=37, L=5"):
        make_moda_flex(T, L, device="cpu", block_size=16, compile=False)(q[:, :10], k[:, :10], v[:, :10])


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_flex_compiled_gradients_reach_all_inputs():
    from moda_bench.kernels.moda.flex import make_moda_flex
    from moda_bench.timing import make_inputs
    inp = make_inputs(1, 300, 16, 4, 64, 6, dtype=torch.bfloat16, device="cuda", seed=0)
    names = ("q", "k", "v", "k_depth", "v_depth")
    out = make_moda_flex(300, 6, device="cuda")(*(inp[n] for n in names))
    out.backward(inp["do"])
    ref_in = [inp[n].detach().double().requires_grad_() for n in names]
    ref = moda_reference(*ref_in, out_dtype=torch.float64)
    ref.backward(inp["do"].double())
    assert (out.double() - ref).norm() / ref.norm() < 2e-2
    for n, r in zip(names, ref_in):
        assert (inp[n].grad.double() - r.grad).norm() / r.grad.norm() < 3e-2, n


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_real_providers_small_sweep(tmp_path):
    frame = run_sweep(plan_points("T", [512, 1000], Point()),
                      RunSpec(providers.DEFAULT_PROVIDERS, "fwdbwd", timing=TimingOptions(warmup_ms=5, min_time_ms=10)),
                      tmp_path / "sweep_T.csv", sweep_name="T", progress=False)
    assert len(frame) == 2 * len(providers.DEFAULT_PROVIDERS)
    ok = frame[frame["status"] == "ok"]
    assert {"moda", "fa2", "fa2-triton", "flex"} <= set(ok["provider"]), frame[["provider", "status", "reason"]]
    assert (ok["max_rel_err"] < 4e-2).all() and (ok["median_ms"] > 0).all() and (ok["peak_mem_mb"] > 0).all()
    assert (ok[ok["provider"] == "fa2"]["extra_time_pct"] == 0).all()


def test_repeat_error_flags_a_forward_that_changes_between_calls():
    """`repeat_err`: 0 for a forward that repeats bitwise, ||b - a|| / ||a|| for one that does not
    (here: one row of 64 changes on the second call, as the in-place merge's race did), NaN off
    CUDA. The device string decides; these CPU tensors stand in for a GPU's."""
    from moda_bench.bench.point import repeat_error
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
    assert repeat_error(lambda: x * 2, "cuda:0") == 0.0
    assert repeat_error(lambda: (x * 2, None), "cuda") == 0.0          # (out, lse) providers
    calls = []

    def racy():
        calls.append(1)
        y = x.clone()
        if len(calls) % 2 == 0:
            y[17] += 1.0
        return y
    err = repeat_error(racy, "cuda")
    assert err == pytest.approx(float(torch.ones(32).norm() / x.norm()), rel=1e-6) and err > 0
    assert math.isnan(repeat_error(racy, "cpu"))
    assert "repeat_err" in schema.MEASURE_COLUMNS and "repeat_err" in schema.COLUMNS


def test_providers_of_a_point_share_their_inputs(tmp_path, registry, fakes):
    """One input set per depth count in a point: the depth providers get the same tensors (the
    same seed made them equal anyway), the sequence-only ones theirs; a provider's dict is its own
    copy (adding a key does not reach the others); a new point makes new inputs."""
    seen = []

    def recorder(name):
        def prepare(inputs, point, chunk):
            seen.append((name, point.T, inputs))
            inputs[f"seen-{name}"] = None   # must stay in this provider's dict
            return Prepared(lambda: moda_reference(inputs["q"], inputs["k"], inputs["v"], inputs["k_depth"],
                                                   inputs["v_depth"]), impl_detail=name)
        return prepare

    register_provider("rec-a")(recorder("rec-a"))
    register_provider("rec-b")(recorder("rec-b"))
    register_provider("rec-seq", uses_depth=False)(recorder("rec-seq"))
    frame, _ = _run(tmp_path, [TINY, TINY.replace(T=40)], ["rec-a", "rec-b", "rec-seq"],
                    lambda fn, **kw: (fn(), {"median_ms": 1.0, "p20_ms": 1.0, "p80_ms": 1.0})[1])
    assert (frame["status"] == "ok").all(), frame["reason"].tolist()
    by = {(n, t): ins for n, t, ins in seen}
    for T in (24, 40):
        a, b, s = by[("rec-a", T)], by[("rec-b", T)], by[("rec-seq", T)]
        for name in ("q", "k", "v", "k_depth", "v_depth", "do"):
            assert a[name] is b[name]
        assert a is not b and "seen-rec-a" in a and "seen-rec-a" not in b and "seen-rec-b" in b
        assert s["k_depth"] is None and s["q"] is not a["q"]
    assert by[("rec-a", 24)]["q"].shape[1] == 24 and by[("rec-a", 40)]["q"].shape[1] == 40
