"""moda_bench.host: the host canary, `--pin-cpu` (parsing, one-line errors, the worker -> CPU
mapping, pinning with os.sched_setaffinity faked), the host columns of the schema, run.json's
host record, the report's GPU-state block, and results files written before the host columns
existed."""
from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path

import pandas as pd
import pytest
import torch

from moda_bench import host, results, schema

HAS_CUDA = torch.cuda.is_available()
DATA = Path(__file__).resolve().parent / "data" / "report" / "results"


@pytest.fixture(autouse=True)
def fresh_states():
    host.forget()
    yield
    host.forget()


@pytest.fixture
def fake_affinity(monkeypatch):
    """os.sched_getaffinity / sched_setaffinity of an 8-CPU machine, recording each set."""
    state = {"cpus": set(range(8)), "calls": []}

    def set_aff(pid, cpus):
        assert pid == 0
        state["calls"].append(set(cpus))
        state["cpus"] = set(cpus)

    monkeypatch.setattr(os, "sched_setaffinity", set_aff, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(state["cpus"]), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    return state


# ----------------------------------------------------------------------------- the option

@pytest.mark.parametrize("text, want", [(None, ()), ("", ()), ("off", ()), ("OFF", ()), ("3", (3,)),
                                        ("3,5,7,9", (3, 5, 7, 9)), (" 3, 5 ", (3, 5)), ("0", (0,))])
def test_parse_pin_cpu(text, want):
    assert host.parse_pin_cpu(text) == want
    assert host.parse_pin_cpu(host.format_pin_cpu(want)) == want


@pytest.mark.parametrize("text, message", [
    ("x", "--pin-cpu must be 'off' or comma-separated CPU ids such as 3 or 3,5,7,9, got 'x'"),
    ("3,", "--pin-cpu must be 'off' or comma-separated CPU ids"),
    ("-1", "--pin-cpu must be 'off' or comma-separated CPU ids"),
    ("on", "--pin-cpu must be 'off' or comma-separated CPU ids"),
    ("3,3", "--pin-cpu repeats a CPU id: '3,3'"),
])
def test_parse_pin_cpu_errors_are_one_line(text, message):
    with pytest.raises(ValueError) as err:
        host.parse_pin_cpu(text)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_worker_i_takes_item_i_mod_len():
    assert [host.cpu_for_worker((3, 5), i) for i in range(5)] == [3, 5, 3, 5, 3]
    assert [host.cpu_for_worker((7,), i) for i in range(3)] == [7, 7, 7]
    assert host.cpu_for_worker((), 2) is None


def test_check_pin_cpu_names_the_allowed_cpus(fake_affinity):
    host.check_pin_cpu((0, 7))
    host.check_pin_cpu(())
    with pytest.raises(ValueError) as err:
        host.check_pin_cpu((3, 12, 40), allowed={0, 1, 2, 3, 8})
    assert str(err.value) == "--pin-cpu: CPU 12, 40 not available to this process (allowed: 0-3,8)"
    with pytest.raises(ValueError, match=r"CPU 9 not available to this process \(allowed: 0-7\)"):
        host.check_pin_cpu((9,))


def test_platform_without_sched_setaffinity(monkeypatch):
    monkeypatch.delattr(os, "sched_setaffinity", raising=False)
    host.check_pin_cpu(())                         # not asked: fine
    assert host.pin_process((), 0) is None
    assert host.host_cpus() == "all"
    with pytest.raises(ValueError) as err:
        host.pin_process((3,), 0)
    assert str(err.value) == ("--pin-cpu: this platform cannot pin a process to a CPU (no os.sched_setaffinity); "
                              "use --pin-cpu off")


def test_pin_process_sets_the_workers_cpu(fake_affinity):
    for worker in range(4):
        assert host.pin_process((3, 5), worker) == (3, 5)[worker % 2]
    assert fake_affinity["calls"] == [{3}, {5}, {3}, {5}]
    assert host.host_cpus() == "5"
    assert host.pin_process((), 1) is None and len(fake_affinity["calls"]) == 4   # off: affinity untouched


def test_host_cpus_text(fake_affinity):
    assert host.host_cpus() == "all"               # every CPU of the machine
    fake_affinity["cpus"] = {0, 1, 2, 3, 7}
    assert host.host_cpus() == "0-3,7"
    fake_affinity["cpus"] = {3}
    assert host.host_cpus() == "3"


# ----------------------------------------------------------------------------- the canary

def test_host_canary_without_cuda_is_nan(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = host.host_canary(calls=5, warmup=1)
    assert list(out) == schema.HOST_COLUMNS
    assert all(math.isnan(v) for v in out.values())


@pytest.mark.skipif(HAS_CUDA, reason="needs a torch whose CUDA calls fail")
@pytest.mark.parametrize("device", [None, 1])
def test_host_canary_never_raises_when_cuda_calls_fail(monkeypatch, device):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)   # claimed, but this torch has no CUDA
    out = host.host_canary(calls=5, warmup=1, device=device)
    assert list(out) == schema.HOST_COLUMNS and all(math.isnan(v) for v in out.values())


def test_median_call_us_issues_calls_back_to_back():
    log = []
    us = host.median_call_us(lambda: log.append("call"), calls=50, warmup=7, sync=lambda: log.append("sync"))
    assert log == ["call"] * 7 + ["sync"] + ["call"] * 50 + ["sync"]   # no sync between the timed calls
    assert 0 < us < 1e4


@pytest.mark.skipif(HAS_CUDA or os.environ.get("TRITON_INTERPRET") != "1", reason="CPU interpreter test")
def test_launch_kernel_runs_in_the_interpreter():
    out = torch.zeros(2)
    host.canary_kernel[(1,)](out, *[float(i) for i in range(30)], ONE=1)
    assert out.tolist() == [29.0, 0.0]


def test_process_host_pins_first_and_runs_the_canary_once(fake_affinity):
    seen = []

    def canary():
        seen.append(set(fake_affinity["cpus"]))    # the CPUs the canary ran on
        return {"host_launch_us": 30.0, "host_op_us": 8.0, "host_autograd_us": 90.0}

    a = host.process_host((2, 6), 1, canary=canary)
    b = host.process_host((2, 6), 1, canary=canary)
    assert a is b and seen == [{6}]                # pinned before the canary; once per process
    assert a.pinned == 6 and a.worker == 1 and a.pid == os.getpid()
    assert a.columns() == {"host_launch_us": 30.0, "host_op_us": 8.0, "host_autograd_us": 90.0, "host_cpus": "6"}
    assert set(a.columns()) == set(schema.HOST_COLUMNS) | {"host_cpus"}
    assert "CPUs 6; Triton launch 30.0 us, torch op 8.0 us, autograd fwd+bwd 90.0 us" == host.describe(a.columns())


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_host_canary_on_cuda_is_positive_and_finite():
    out = host.host_canary()
    assert list(out) == schema.HOST_COLUMNS
    for name, v in out.items():
        assert math.isfinite(v) and 0 < v < 1e5, (name, v)


# ----------------------------------------------------------------------------- schema, files, run.json

def test_host_columns_in_the_schema_not_in_the_key():
    for c in schema.HOST_COLUMNS:
        assert c in schema.MEASURE_COLUMNS and c in schema.NUMERIC_COLUMNS and c in schema.COLUMNS
    assert "host_cpus" in schema.TEXT_COLUMNS and "host_cpus" not in schema.NUMERIC_COLUMNS
    assert not (set(schema.HOST_COLUMNS) | {"host_cpus"}) & set(schema.ROW_KEY)
    assert not (set(schema.HOST_COLUMNS) | {"host_cpus"}) & set(schema.REQUIRED_COLUMNS)


def test_a_file_from_before_the_host_columns_reads(tmp_path):
    old_columns = [c for c in schema.COLUMNS if c not in schema.HOST_COLUMNS + ["host_cpus"]]
    row = {c: "" for c in old_columns}
    row.update(sweep="T", provider="fa2", T=1024, G=8, Hq=64, Hk=8, L=64, B=1, d=64, C=64, dtype="bfloat16",
               median_ms=0.4, status="ok", gpu="NVIDIA H100 80GB HBM3", torch_version="2.11.0",
               triton_version="3.6.0", git_commit="8581c9f", timestamp="2026-11-26T00:00:00+00:00",
               **{"pass": "fwdbwd"})
    path = tmp_path / "old.csv"
    pd.DataFrame([row], columns=old_columns).to_csv(path, index=False)
    df = results.read_csv(path)
    assert list(df.columns[: len(schema.COLUMNS)]) == schema.COLUMNS and len(df) == 1
    assert df[schema.HOST_COLUMNS].isna().all().all() and (df["host_cpus"] == "").all()
    assert df["median_ms"].iloc[0] == 0.4
    committed = results.read_results([DATA], warn=lambda m: None)   # the report tests' older files
    assert len(committed) > 0 and committed[schema.HOST_COLUMNS].isna().all().all()


def test_gpu_state_shows_host_numbers_where_rows_have_them(tmp_path):
    """Rows carrying the host canary and host_cpus (run-a): the GPU-state block gets the median
    host numbers and the CPUs with their row counts; a folder without them (run-b) shows '-'."""
    from test_report import table_rows, write_new_results, write_schema_csv

    from moda_bench.reports.report import generate_report
    res = tmp_path / "results"
    rows = write_new_results(res)
    a = [dict(r, host_launch_us=30.0 + i, host_op_us=8.0, host_autograd_us=90.0, host_cpus="3" if i else "all")
         for i, r in enumerate(rows["run-a"])]
    write_schema_csv(res / "run-a" / "sweep_T.csv", a)
    generate_report([res], tmp_path / "out", figures=False)
    md = (tmp_path / "out" / "REPORT.md").read_text()
    header, body = table_rows(md, "## GPU state")
    by = {r[0]: r for r in body}
    launch = statistics.median(r["host_launch_us"] for r in a)
    assert by["results/run-a"][header.index("host us: launch / op / autograd (median)")] == f"{launch:.1f} / 8.0 / 90.0"
    assert by["results/run-a"][header.index("host CPUs (rows)")] == f"3 ({len(a) - 1}), all (1)"
    assert by["results/run-b"][header.index("host us: launch / op / autograd (median)")] == "-"
    assert by["results/run-b"][header.index("host CPUs (rows)")] == "-"
    assert "eager rows at short T time the host" in md

def test_run_spec_carries_pin_cpu():
    from moda_bench.bench.spec import RunSpec
    spec = RunSpec(["moda"], "fwdbwd", pin_cpu=[3, 5])
    assert spec.pin_cpu == (3, 5) and RunSpec.from_json(spec.to_json()).pin_cpu == (3, 5)
    old = {k: v for k, v in spec.to_dict().items() if k != "pin_cpu"}   # a spec from before the option
    assert RunSpec.from_dict(old).pin_cpu == ()


def test_run_record_has_the_pin_and_each_processs_host(tmp_path):
    from moda_bench.bench import sweep as run
    from moda_bench.bench.spec import RunSpec
    spec = RunSpec(["moda", "fa2"], "fwdbwd", pin_cpu=(3, 5))
    run.write_run_record(tmp_path, [], spec, pin_chunk=False, preset=None, gpus="0,1",
                         extra={"host": [{"gpu_index": 0, "host_cpus": "3"}]})
    rec = json.loads((tmp_path / "run.json").read_text())
    assert rec["pin_cpu"] == "3,5" and rec["host"] == [{"gpu_index": 0, "host_cpus": "3"}]
    frame = pd.DataFrame([
        {"gpu_index": 1, "host_cpus": "5", "host_launch_us": 31.0, "host_op_us": 8.0, "host_autograd_us": math.nan},
        {"gpu_index": 0, "host_cpus": "3", "host_launch_us": 30.0, "host_op_us": 7.0, "host_autograd_us": 90.0},
        {"gpu_index": 0, "host_cpus": "3", "host_launch_us": 99.0, "host_op_us": 9.0, "host_autograd_us": 99.0},
        {"gpu_index": 2, "host_cpus": "", "host_launch_us": math.nan, "host_op_us": math.nan,
         "host_autograd_us": math.nan},   # a row the pool wrote for a dead worker: no host
    ])
    hosts = run.host_records([frame, None])
    assert hosts == [
        {"gpu_index": 0, "host_cpus": "3", "host_launch_us": 30.0, "host_op_us": 7.0, "host_autograd_us": 90.0},
        {"gpu_index": 1, "host_cpus": "5", "host_launch_us": 31.0, "host_op_us": 8.0, "host_autograd_us": None}]
    run.update_run_record(tmp_path, host=hosts)
    rec = json.loads((tmp_path / "run.json").read_text())
    assert rec["host"] == hosts and rec["pin_cpu"] == "3,5"
    assert json.loads((tmp_path / "run.json").read_text())["host"][1]["host_autograd_us"] is None


def test_doctor_host_table():
    from rich.console import Console

    from moda_bench.cli.doctor import host_table
    console = Console(width=200, record=True)
    console.print(host_table({"host_launch_us": 36.7, "host_op_us": math.nan, "host_autograd_us": 95.25}, "3"))
    text = console.export_text()
    assert "bare Triton launch, 30 scalar arguments" in text and "36.7" in text and "95.2" in text
    assert "CPU affinity: 3" in text and "nan" not in text


def test_ablate_rejects_a_bad_pin_in_one_line():
    import typer
    from typer.testing import CliRunner

    from moda_bench.cli.ablate import ablate_command
    app = typer.Typer()
    app.command()(ablate_command)
    res = CliRunner().invoke(app, ["--pin-cpu", "3,x"], env={"COLUMNS": "200"})
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "--pin-cpu must be 'off' or comma-separated CPU ids" in " ".join(res.output.split())


def test_pool_worker_exits_2_when_its_cpu_cannot_be_pinned(capsys):
    import typer

    from moda_bench.bench.pool.worker import gpu_start
    from moda_bench.bench.spec import RunSpec
    start = gpu_start(RunSpec(["moda"], "fwd", pin_cpu=(0, 100000)), Path("unused.csv"), worker=1)
    with pytest.raises(typer.Exit) as exit_:
        start()
    assert exit_.value.exit_code == 2
    assert "worker: --pin-cpu: CPU 100000 not available to this process (allowed: " in capsys.readouterr().err
