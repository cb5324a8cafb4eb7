"""The floor model (moda_bench.floor), the run spec (bench.spec), the new configuration columns of
the row key (depth_grad, Tq, S, gpu) and the presets and options that produce them; CPU only."""
from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from typer.testing import CliRunner

from moda_bench import floor, results, schema
from moda_bench.bench.point import TimingOptions
from moda_bench.bench.presets import load_preset, preset_sweeps
from moda_bench.bench.runner import Point, base_row, schema_rows
from moda_bench.bench.spec import RunSpec, parse_timers, rates_from_verdicts
from moda_bench.bench.sweep import plan_run

BASE = dict(B=1, T=16384, Hq=64, Hk=8, d=64)


# ----------------------------------------------------------------------------- floor model

def test_moda_bytes_count_every_tensor_once_per_pass():
    e, q, kv = 2, 16384 * 64 * 64 * 2, 16384 * 8 * 64 * 2
    depth, lse = 16384 * 64 * 8 * 64 * 2, 16384 * 64 * 4
    fwd = floor.moda_work("fwd", L=64, **BASE)
    assert fwd.bytes == 2 * q + 2 * kv + 2 * depth + lse          # q, k, v, depth in; out, lse out
    bwd = floor.moda_work("bwd", L=64, **BASE)
    assert bwd.bytes == 4 * q + 4 * kv + lse + 4 * depth            # + dq, dk, dv, dk_depth, dv_depth
    detached = floor.moda_work("bwd", L=64, depth_grad=False, **BASE)
    assert bwd.bytes - detached.bytes == 2 * depth                  # no depth gradients written
    both = floor.moda_work("fwdbwd", L=64, **BASE)
    assert both.bytes == fwd.bytes + bwd.bytes and both.flops == fwd.flops + bwd.flops
    assert e == floor.elem_bytes("bfloat16") and floor.elem_bytes("float32") == 4


def test_moda_flops_match_the_spec_and_the_detached_backward():
    seq = 4 * 64 * 64 * 16384 * 16385 / 2
    dep = 4 * 64 * 64 * 16384 * 64
    assert floor.moda_work("fwd", L=64, **BASE).flops == pytest.approx(seq + dep)
    assert floor.moda_work("fwdbwd", L=64, **BASE).flops == pytest.approx(
        schema.pass_flops("fwdbwd", 1, 64, 16384, 64, 64))
    assert floor.moda_work("bwd", L=64, depth_grad=False, **BASE).flops == pytest.approx(2.5 * seq + 1.5 * dep)
    assert floor.moda_work("fwd", L=0, **BASE) == floor.row_work("sequence", "fwd", L=64, **BASE)


def test_floor_is_the_larger_of_compute_and_traffic():
    rates = floor.Rates(800.0, 4000.0, "canary")
    w = floor.Work(8e12, 4e9)          # 10 ms of matmul, 1 ms of traffic
    assert floor.floor_ms(w, rates) == pytest.approx(10.0)
    w = floor.Work(8e9, 4e9)           # memory bound: 1 ms
    assert floor.floor_ms(w, rates) == pytest.approx(1.0)
    cols = floor.floor_columns(w, rates, 2.0)
    assert cols["of_floor"] == pytest.approx(2.0) and cols["gbps"] == pytest.approx(2000.0)
    unknown = floor.floor_columns(w, floor.Rates(), 2.0)
    assert math.isnan(unknown["floor_ms"]) and math.isnan(unknown["of_floor"]) and unknown["gbps"] == 2000.0


def test_decode_work_counts_the_cache_once_and_the_causal_tail():
    w = floor.decode_work(B=2, T=100, Tq=1, Hq=8, Hk=2, d=16, L=3)
    assert w.bytes == 2 * (2 * 2 * 1 * 8 * 16 + 2 * 200 * 2 * 16 + 2 * 2 * 1 * 3 * 2 * 16)
    assert w.flops == 4 * 8 * 16 * 2 * (100 + 3)                   # each row: 100 cached keys + 3 depth
    multi = floor.decode_work(B=1, T=10, Tq=4, Hq=1, Hk=1, d=1, L=0)
    assert multi.flops == 4 * (7 + 8 + 9 + 10)                     # token i sees positions 0..6+i
    ragged = floor.decode_work(B=2, T=100, Tq=1, Hq=1, Hk=1, d=1, L=0, seqlens=[10, 50])
    assert ragged.bytes == 2 * (2 * 2 + 2 * 60) and ragged.flops == 4 * 60
    with pytest.raises(ValueError, match="seqlens has 1 entries"):
        floor.decode_work(B=2, T=10, Tq=1, Hq=1, Hk=1, d=1, L=0, seqlens=[3])


def test_depth_attention_work_is_mix_plus_plain_attention():
    mix = floor.mix_work("fwd", B=1, T=4, Hq=8, Hk=2, d=16, S=3)
    assert mix.bytes == 2 * (4 * 8 * 16 + 3 * 4 * 2 * 16 + 2 * 4 * 3 * 2 * 16)
    total = floor.row_work("dattn", "fwdbwd", B=1, T=4, Hq=8, Hk=2, d=16, S=3)
    assert total == floor.mix_work("fwdbwd", 1, 4, 8, 2, 16, 3) + floor.moda_work("fwdbwd", 1, 4, 8, 2, 16, 0)
    with pytest.raises(ValueError, match="unknown provider kind"):
        floor.row_work("nope", "fwd", **BASE)
    with pytest.raises(ValueError, match="pass must be one of decode"):
        floor.row_work("decode", "fwd", **BASE)


# ----------------------------------------------------------------------------- run spec

def test_run_spec_round_trips_and_knows_its_timers():
    spec = RunSpec(["moda", "fa2", "moda"], "fwdbwd", timing=TimingOptions(min_samples=7), use_tuned=False,
                   health="healthy", rates=floor.Rates(700.0, 3000.0, "canary"))
    assert spec.providers == ("moda", "fa2") and spec.timer_list() == ("eager",)
    again = RunSpec.from_json(spec.to_json())
    assert again == spec.replace(timers=("eager",))
    assert RunSpec(["moda"], "decode").timer_list() == ("graph", "eager")
    assert RunSpec(["moda"], "decode", timers=("eager",)).timer_list() == ("eager",)
    with pytest.raises(ValueError, match="pass must be one of"):
        RunSpec(["moda"], "prefill")


def test_parse_timers():
    allowed = ("eager", "graph", "do_bench")
    assert parse_timers(None, "fwd", allowed) == ()
    assert parse_timers("graph, eager", "decode", allowed) == ("graph", "eager")
    with pytest.raises(ValueError, match="one or more of"):
        parse_timers("cupti", "fwd", allowed)
    with pytest.raises(ValueError, match="repeats"):
        parse_timers("eager,eager", "fwd", allowed)


def test_rates_from_the_canary_else_the_table():
    class V:
        matmul_tflops, copy_gbps = 650.0, 3900.0
    assert rates_from_verdicts([V()]) == floor.Rates(650.0, 3900.0, "canary")
    table = rates_from_verdicts([], "NVIDIA H100 80GB HBM3")
    assert table.source.startswith("table: H100") and table.known()
    assert not rates_from_verdicts([], "some other GPU").known()


# ----------------------------------------------------------------------------- the row key

def test_new_config_columns_in_rows_and_defaults_for_old_files(tmp_path):
    p = Point(T=64, depth_grad=False, S=3, L=3)
    row = base_row(p, "dattn", "fwdbwd", "S")
    assert (row["depth_grad"], row["S"], row["Tq"], row["L"]) == (0, 3, 0, 3)
    assert {"depth_grad", "Tq", "S"} <= set(schema.ROW_KEY) and "gpu" in schema.ROW_KEY
    old = pd.DataFrame([{c: v for c, v in row.items() if c not in ("depth_grad", "Tq", "S", "flops", "of_floor")}])
    old[["median_ms", "status", "gpu", "torch_version", "triton_version", "git_commit", "timestamp"]] = \
        [1.0, "ok", "g", "t", "t", "c", "2026-01-01T00:00:00+00:00"]
    path = tmp_path / "old.csv"
    old.to_csv(path, index=False)
    back = results.read_csv(path)
    assert (back.loc[0, "depth_grad"], back.loc[0, "Tq"], back.loc[0, "S"]) == (1.0, 0.0, 0.0)
    assert math.isnan(back.loc[0, "of_floor"])


def test_rows_of_two_gpus_are_both_kept(tmp_path):
    rows = []
    for gpu, ms in (("NVIDIA H100 80GB HBM3", 2.0), ("NVIDIA H200", 1.5)):
        r = base_row(Point(T=64), "moda", "fwdbwd", "T")
        r.update(median_ms=ms, status="ok", gpu=gpu, torch_version="t", triton_version="t", git_commit="c",
                 timestamp="2026-01-01T00:00:00+00:00")
        rows.append(r)
    path = tmp_path / "both.csv"
    results.write_csv_atomic(path, schema_rows(pd.DataFrame(rows, columns=schema.COLUMNS)))
    keep, old = results.newest(results.read_csv(path))
    assert sorted(keep["gpu"]) == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"] and old.empty


# ----------------------------------------------------------------------------- presets

def test_decode_preset_plans_B_sweeps_per_context_length(tmp_path):
    specs = preset_sweeps("decode")
    assert load_preset("decode").pass_ == "decode"
    plans = plan_run(specs, Point(), tmp_path, pin_chunk=False)
    assert [s.name for s in plans] == ["decode-T2048", "decode-T8192", "decode-T32768", "decode-T131072"]
    for s, T in zip(plans, (2048, 8192, 32768, 131072)):
        assert [p.B for p in s.points] == [1, 8, 32, 128]
        assert all((p.T, p.Tq, p.G, p.Hk, p.d, p.L) == (T, 1, 8, 8, 64, 64) for p in s.points)
        assert s.csv.name == f"sweep_{s.name}.csv"


def test_depth_attention_preset_has_the_seed_heads_and_S_equals_L(tmp_path):
    plans = plan_run(preset_sweeps("depth-attention"), Point(), tmp_path, pin_chunk=False)
    assert len(plans) == 8
    heads = {(p.Hq, p.Hk) for s in plans for p in s.points}
    assert heads == {(24, 6), (32, 8)}
    for s in plans:
        assert [p.S for p in s.points] == [1, 2, 4, 8, 16, 47] and all(p.L == p.S for p in s.points)
    # a command-line override wins over the preset's own base fields
    fixed = plan_run(preset_sweeps("depth-attention")[:1], Point(T=1024), tmp_path / "x", pin_chunk=False,
                     fixed=("T",))
    assert all(p.T == 1024 for p in fixed[0].points)


# ----------------------------------------------------------------------------- options

def _invoke(*args):
    import typer

    from moda_bench.cli.sweep import sweep_command
    app = typer.Typer()
    app.command("sweep")(sweep_command)
    app.command("noop")(lambda: None)
    return CliRunner().invoke(app, ["sweep", *args], env={"COLUMNS": "200"})


@pytest.mark.parametrize("args,message", [
    (["--vary", "T", "--depth-grad", "maybe"], "--depth-grad must be on or off"),
    (["--vary", "T", "--timer", "eager,cupti"], "--timer must be one or more of"),
    (["--preset", "decode", "--pass", "fwd"], "is a decode preset"),
    (["--vary", "T", "--Tq", "2"], "apply to --pass decode"),
    (["--vary", "B", "--pass", "decode", "--providers", "moda,flex"], "unknown decode provider 'flex'"),
    (["--vary", "Q"], "--vary must be one of"),
])
def test_bad_options_are_one_line_errors(args, message):
    res = _invoke(*args)
    assert res.exit_code == 2 and message in " ".join(res.output.split()), res.output
    assert "Traceback" not in res.output


def test_decode_and_detached_runs_record_their_spec(tmp_path, monkeypatch):
    """The options reach one RunSpec (providers of the decode family, both timers, the floor's
    rates) and points with Tq=1 or depth_grad off; run.json records them."""
    import torch

    from moda_bench.bench import runner
    from moda_bench.cli import checks
    seen = []

    def fake_run_sweep(points, spec, csv_path, *, sweep_name, **kw):
        seen.append((list(points), spec))
        return pd.DataFrame(columns=schema.COLUMNS)

    monkeypatch.setattr(runner, "run_sweep", fake_run_sweep)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(checks.RunHealth, "rates", lambda self: floor.Rates(700.0, 3000.0, "canary"))
    res = _invoke("--vary", "B", "--values", "1,8", "--pass", "decode", "--T", "4096", "--no-health-check",
                  "--out", str(tmp_path / "d"))
    assert res.exit_code == 0, res.output
    points, spec = seen[-1]
    assert spec.pass_ == "decode" and spec.timer_list() == ("graph", "eager")
    assert spec.providers == ("moda", "moda-nosplit", "fa2", "cudnn", "fa4", "flashinfer")
    assert [(p.B, p.T, p.Tq) for p in points] == [(1, 4096, 1), (8, 4096, 1)]
    run = json.loads((tmp_path / "d" / "run.json").read_text())
    assert run["floor_rates"] == {"matmul_tflops": 700.0, "copy_gbps": 3000.0, "source": "canary"}
    assert run["timers"] == ["graph", "eager"] and run["pass"] == "decode"
    res = _invoke("--vary", "T", "--values", "64", "--depth-grad", "off", "--providers", "moda,fa2",
                  "--no-health-check", "--out", str(tmp_path / "o"))
    assert res.exit_code == 0, res.output
    points, spec = seen[-1]
    assert [p.depth_grad for p in points] == [False] and spec.timer_list() == ("eager",)


# ----------------------------------------------------------------------------- through the runner

def _cpu_timer(fn, **kw):
    fn()
    return {"median_ms": 2.0, "p20_ms": 2.0, "p80_ms": 2.0}


def test_depth_attention_and_detached_rows_through_the_runner(tmp_path):
    """dattn, dattn-torch, dattn-mix and moda at L = S on the CPU interpreter: checked against
    their own references, floor columns filled from the spec's rates; a detached-depth point
    runs MoDA with depth_grad off and records it."""
    from moda_bench.bench.runner import run_sweep
    rates = floor.Rates(100.0, 1000.0, "test")
    pt = Point(T=17, G=2, Hk=1, L=2, S=2, d=16, dtype="float32")
    spec = RunSpec(["dattn", "dattn-torch", "dattn-mix", "moda"], "fwdbwd", rates=rates)
    f = run_sweep([pt], spec, tmp_path / "s.csv", sweep_name="S", device="cpu", timer=_cpu_timer, progress=False,
                  seed=0).set_index("provider")
    assert (f["status"] == "ok").all(), f["reason"].to_dict()
    assert (f["max_rel_err"] < 1e-5).all() and (f[["S", "L"]] == 2).all().all()
    want = floor.row_work("dattn", "fwdbwd", B=1, T=17, Hq=2, Hk=1, d=16, S=2, dtype="float32")
    assert f.loc["dattn", "bytes"] == want.bytes == f.loc["dattn-torch", "bytes"]
    assert f.loc["dattn", "floor_ms"] == pytest.approx(floor.floor_ms(want, rates))
    assert f.loc["dattn", "of_floor"] == pytest.approx(2.0 / floor.floor_ms(want, rates))
    assert f.loc["dattn-mix", "bytes"] == floor.mix_work("fwdbwd", 1, 17, 2, 1, 16, 2, dtype="float32").bytes
    assert "fused Triton" in f.loc["dattn", "impl_detail"] and "plain PyTorch" in f.loc["dattn-torch", "impl_detail"]
    det = run_sweep([Point(T=17, G=2, Hk=1, L=3, d=16, dtype="float32", depth_grad=False)],
                    RunSpec(["moda"], "fwdbwd"), tmp_path / "d.csv", sweep_name="T", device="cpu", timer=_cpu_timer,
                    progress=False, seed=0).iloc[0]
    assert det["status"] == "ok" and det["depth_grad"] == 0 and "depth detached" in det["impl_detail"]
    assert det["bytes"] == floor.moda_work("fwdbwd", 1, 17, 2, 1, 16, 3, dtype="float32", depth_grad=False).bytes


def test_decode_rows_through_the_runner(tmp_path):
    """The decode pass: decode inputs, the decode reference, one row per provider and timer
    (the injected timer stands for both), floor columns of the decode model; sequence-only
    peers run with L = 0 and GPU-only ones are skipped with the reason on the CPU."""
    from moda_bench.bench.runner import run_sweep
    rates = floor.Rates(100.0, 1000.0, "test")
    pts = [Point(T=37, Tq=2, G=4, Hk=1, L=3, B=2, d=16, dtype="float32")]
    spec = RunSpec(["moda", "moda-nosplit", "fa2", "fa4"], "decode", rates=rates)
    f = run_sweep(pts, spec, tmp_path / "d.csv", sweep_name="decode", device="cpu", timer=_cpu_timer,
                  progress=False, seed=0).set_index("provider")
    for name in ("moda", "moda-nosplit"):
        assert f.loc[name, "status"] == "ok" and f.loc[name, "max_rel_err"] < 1e-5, f.loc[name, "reason"]
    assert "1 split(s) (pinned)" in f.loc["moda-nosplit", "impl_detail"]
    assert f.loc["fa2", "status"] == "skipped" and f.loc["fa4", "status"] == "skipped"
    want = floor.decode_work(2, 37, 2, 4, 1, 16, 3, dtype="float32")
    assert f.loc["moda", "bytes"] == want.bytes and f.loc["moda", "flops"] == want.flops
    assert f.loc["moda", "gbps"] == pytest.approx(want.bytes / 2e6) and (f["Tq"] == 2).all()
    assert (f["pass"] == "decode").all()


def test_a_point_timed_under_a_hard_throttle_marks_its_rows():
    from moda_bench.bench.point import mark_health, point_throttle
    assert point_throttle("sw_power_cap") == ""
    assert point_throttle("sw_power_cap|hw_slowdown|sw_thermal") == "hw_slowdown|sw_thermal"
    assert mark_health("healthy", "sw_thermal") == "degraded: clocks throttled during this point: sw_thermal"
    assert mark_health("", "hw_slowdown").startswith("degraded: clocks throttled")
    assert mark_health("shared: 1 other process(es)", "sw_thermal") == "shared: 1 other process(es)"


def test_degrade_appends_a_second_reason_once():
    from moda_bench.bench.point import degrade, mark_health
    once = mark_health("healthy", "sw_thermal")
    both = degrade(once, "memory: 3 allocator retries")
    assert both == "degraded: clocks throttled during this point: sw_thermal; memory: 3 allocator retries"
    assert degrade(both, "memory: 3 allocator retries") == both
    assert degrade("unknown", "memory: 1 allocator retries") == "degraded: memory: 1 allocator retries"
    assert degrade("unhealthy: copy 40% of the reference", "memory: 2") == "unhealthy: copy 40% of the reference"


def test_alloc_retries_off_cuda_is_zero(monkeypatch):
    import torch

    from moda_bench.bench.point import alloc_retries
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert alloc_retries(None) == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda idx: {"num_alloc_retries": 7})
    assert alloc_retries(0) == 7


def test_depth_attention_preset_times_graph_and_eager(tmp_path, monkeypatch):
    import torch

    from moda_bench.bench import runner
    from moda_bench.bench.presets import load_preset
    from moda_bench.cli import checks
    seen = []
    monkeypatch.setattr(runner, "run_sweep", lambda points, spec, csv_path, **kw: seen.append(spec))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(checks.RunHealth, "rates", lambda self: floor.Rates())
    res = _invoke("--preset", "depth-attention", "--no-health-check", "--out", str(tmp_path / "a"))
    assert res.exit_code == 0, res.output
    assert len(seen) == 8 and seen[0].timer_list() == load_preset("depth-attention").timers == ("graph", "eager")
    assert seen[0].providers == ("dattn", "dattn-torch", "dattn-mix", "fa4", "fa2", "moda", "moda-fa4")
    res = _invoke("--preset", "depth-attention", "--timer", "eager", "--no-health-check", "--out", str(tmp_path / "b"))
    assert res.exit_code == 0 and seen[-1].timer_list() == ("eager",)


def test_a_decode_point_too_big_for_all_its_providers_is_skipped_whole(monkeypatch):
    import torch

    from moda_bench.bench import decode_providers as dp
    from moda_bench.bench.providers import get_provider
    provs = [get_provider(n, "decode") for n in ("moda", "fa2", "cudnn")]
    p = Point(B=128, T=131072, Tq=1, G=8, Hk=8, d=64, L=64)
    per = dp.decode_input_bytes(p, 0)
    assert dp.point_does_not_fit(p, provs, "cpu") is None
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(2.5 * per), 80 * 2**30))
    reason = dp.point_does_not_fit(p, provs, "cuda:0")
    assert reason.startswith("does not fit: the 3 providers' inputs need") and "GiB free" in reason
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10 * per, 80 * 2**30))
    assert dp.point_does_not_fit(p, provs, "cuda:0") is None


def test_only_selects_sweeps_of_a_preset_in_its_order(tmp_path, monkeypatch):
    import torch

    from moda_bench.bench import runner
    from moda_bench.bench.presets import preset_sweeps
    from moda_bench.cli import checks
    labels = [s.label for s in preset_sweeps("depth-attention", "dattn-3B-*,dattn-1.5B-T16384")]
    assert labels == ["dattn-3B-T16384", "dattn-3B-T8192", "dattn-3B-T4096", "dattn-3B-T2048", "dattn-1.5B-T16384"]
    with pytest.raises(ValueError, match="no sweep of preset 'decode' matches 'dattn-\\*'; its sweeps: decode-T"):
        preset_sweeps("decode", "dattn-*")
    with pytest.raises(ValueError, match="no sweep names"):
        preset_sweeps("decode", " , ")
    seen = []
    monkeypatch.setattr(runner, "run_sweep", lambda points, spec, csv_path, **kw: seen.append(kw["sweep_name"]))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(checks.RunHealth, "rates", lambda self: floor.Rates())
    res = _invoke("--preset", "depth-attention", "--only", "dattn-1.5B-*", "--no-health-check",
                  "--out", str(tmp_path / "a"))
    assert res.exit_code == 0, res.output
    assert seen == ["dattn-1.5B-T16384", "dattn-1.5B-T8192", "dattn-1.5B-T4096", "dattn-1.5B-T2048"]
    res = _invoke("--preset", "depth-attention", "--only", "nope", "--out", str(tmp_path / "b"))
    assert res.exit_code != 0 and "matches 'nope'" in res.output
    res = _invoke("--vary", "T", "--only", "x", "--out", str(tmp_path / "c"))
    assert res.exit_code != 0 and "--only selects sweeps of a --preset" in res.output


def test_require_stops_a_run_whose_providers_cannot_run(tmp_path, monkeypatch):
    from dataclasses import replace

    import torch

    from moda_bench.bench import providers, runner
    from moda_bench.cli import checks
    seen = []
    monkeypatch.setattr(runner, "run_sweep", lambda points, spec, csv_path, **kw: seen.append(spec))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(checks.RunHealth, "rates", lambda self: floor.Rates())
    fa4 = providers.get_provider("fa4", "train")
    table = providers._table("train")
    monkeypatch.setitem(table, "fa4", replace(fa4, unavailable=lambda device: "flash-attn-4 is not installed"))
    res = _invoke("--vary", "T", "--values", "1024", "--providers", "fa2,fa4", "--require", "all",
                  "--no-health-check", "--out", str(tmp_path / "a"))
    assert res.exit_code == 2 and "--require: fa4 cannot run here: flash-attn-4 is not installed" in res.output
    assert seen == []
    res = _invoke("--vary", "T", "--values", "1024", "--providers", "fa2,fa4", "--require", "moda",
                  "--no-health-check", "--out", str(tmp_path / "b"))
    assert res.exit_code != 0 and "--require names moda, not among the providers of this run" in res.output
    monkeypatch.setitem(table, "fa4", replace(fa4, unavailable=lambda device: None))
    res = _invoke("--vary", "T", "--values", "1024", "--providers", "fa2,fa4", "--require", "fa4",
                  "--no-health-check", "--out", str(tmp_path / "c"))
    assert res.exit_code == 0, res.output
    assert len(seen) == 1


def test_point_staged_once_for_all_its_timers(monkeypatch):
    """run_point with two timings (a sweep's two timers): every provider is staged (inputs,
    preparation, accuracy check) once, and each timing fills its own rows: its own medians, the
    staged fields copied, a provider that failed staging failed in both."""
    import moda_bench.bench.point as point_mod
    from moda_bench.bench.providers import resolve_providers
    calls = []
    real_stage = point_mod.stage

    def counting(prov, *a, **kw):
        calls.append(prov.name)
        return real_stage(prov, *a, **kw)
    monkeypatch.setattr(point_mod, "stage", counting)
    pt = Point(T=9, G=2, Hk=1, L=2, d=16, dtype="float32")
    provs = resolve_providers(["fa2-triton", "moda"], "train")
    rows = {t: [base_row(pt, p.name, "fwdbwd", "T") for p in provs] for t in ("first", "second")}

    def timer_of(ms):
        def timer(fn, **kw):
            fn()
            return {"median_ms": ms, "p20_ms": ms, "p80_ms": ms}
        return timer
    opts = TimingOptions()
    point_mod.run_point(provs, pt, "fwdbwd", rows["first"], device="cpu", chunk=None, seed=0, check_len=64,
                        unavailable={"fa2-triton": "not here"}, opts=opts, timer=timer_of(2.0),
                        also=((opts, timer_of(3.0), rows["second"]),))
    assert calls == ["moda"]                     # staged once; the unavailable one never
    first, second = ({r["provider"]: r for r in rows[t]} for t in ("first", "second"))
    assert first["moda"]["median_ms"] == 2.0 and second["moda"]["median_ms"] == 3.0
    assert first["moda"]["status"] == second["moda"]["status"] == "ok"
    for f in ("impl_detail", "max_rel_err", "config"):
        assert second["moda"][f] == first["moda"][f]
    assert second["moda"]["max_rel_err"] < 1e-5
    assert first["fa2-triton"]["status"] == second["fa2-triton"]["status"] == "skipped"
    assert second["fa2-triton"]["reason"] == "not here"
