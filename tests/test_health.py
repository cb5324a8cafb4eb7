"""moda_bench.health (GPU state, references, verdict) and `moda-bench doctor` on the CPU with fake
polls and numbers; the real canary under `gpu`."""
from __future__ import annotations

import json
import sys
import time

import pytest
import typer
from typer.testing import CliRunner

from moda_bench import health
from moda_bench.cli import doctor


@pytest.fixture
def no_nvml(monkeypatch):
    """pynvml cannot be imported (the optional dependency is missing)."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
    health.reset_nvml()
    yield
    health.reset_nvml()


def test_throttle_names_ignore_idle_and_application_clock_bits():
    assert health.throttle_names(0x4 | 0x8 | 0x1 | 0x2) == ["sw_power_cap", "hw_slowdown"]
    assert health.throttle_names(0x40 | 0x80) == ["hw_thermal", "hw_power_brake"]
    assert health.throttle_names(0x1) == [] and health.throttle_names(None) == []


def test_summarize_gpu_polls():
    polls = [{"sm": 345, "mem": 1593, "power": 90.0, "temp": 40, "reasons": 0x1},   # idle: no clock / power
             {"sm": 1500, "mem": 3201, "power": 650.0, "temp": 55, "reasons": 0x4},
             {"sm": 1600, "mem": 3201, "power": 700.0, "temp": 52, "reasons": 0x4 | 0x20},
             {"sm": None, "mem": None, "power": None, "temp": None, "reasons": None}]
    s = health.summarize_gpu(polls)
    assert s == {"sm_clock_mhz": 1550.0, "sm_clock_min_mhz": 1500.0, "mem_clock_mhz": 3201.0,
                 "power_w": pytest.approx(675.0), "temp_c": 55.0, "throttle": "sw_power_cap|sw_thermal"}
    idle = health.summarize_gpu(polls[:1])                            # all idle: counted all the same
    assert idle["throttle"] == "" and idle["sm_clock_mhz"] == 345.0
    empty = health.summarize_gpu([])
    assert set(empty) == set(health.GPU_COLUMNS) and all(v is None for v in empty.values())


def test_sampler_polls_in_the_background_and_at_both_ends():
    calls = []

    def reader():
        calls.append(time.perf_counter())
        return {"sm": 1000 + len(calls), "mem": 2000, "power": 100.0, "temp": 30, "reasons": 0}
    with health.GpuSampler(interval_s=0.005, reader=reader) as s:
        time.sleep(0.1)
    n = len(calls)
    assert n >= 5                                                     # entry, exit and the thread's polls
    time.sleep(0.03)
    assert len(calls) == n                                            # the thread stopped
    out = s.summary()
    assert out["sm_clock_min_mhz"] == 1002.0 and out["throttle"] == ""   # the entry poll (1001) left out


def test_everything_is_empty_without_pynvml(no_nvml):
    assert health.nvml() is None
    assert health.device_handle(0) is None and health.nvml_reader(None) is None
    assert health.other_processes(0) == []
    h = health.gpu_header(0)
    assert h["uuid"] is None and h["driver"] is None and h["other_processes"] == []
    with health.GpuSampler(0, interval_s=0.001) as s:
        time.sleep(0.01)
    assert all(v is None for v in s.summary().values())


def test_known_references():
    assert health.known_reference("NVIDIA H100 80GB HBM3")["label"] == "H100 SXM (HBM3)"
    assert health.known_reference("NVIDIA H100 PCIe")["label"] == "H100 PCIe"
    assert health.known_reference("NVIDIA H200")["matmul_tflops"] == 650.0
    assert health.known_reference("NVIDIA H200 NVL")["label"] == "H200 NVL"
    assert health.known_reference("NVIDIA A100-SXM4-80GB")["copy_gbps"] == 1500.0
    assert health.known_reference("NVIDIA A100-SXM4-40GB")["label"] == "A100 40GB"
    assert health.known_reference("Tesla T4") is None and health.known_reference(None) is None


H200 = "NVIDIA H200"
CALM = {"sm_clock_mhz": 1500.0, "throttle": "sw_power_cap"}


def test_judge_healthy_against_the_table():
    v = health.judge(700.0, 4200.0, name=H200, gpu=CALM, max_sm_clock_mhz=1980)
    assert v.status == "healthy" and v.ok
    assert v.ref_source.startswith("table: H200") and v.ref_matmul_tflops == 650.0
    assert "108%" in v.reason and "\n" not in v.reason


def test_judge_degraded_numbers_say_why():
    v = health.judge(400.0, 4200.0, name=H200, gpu=CALM)
    assert v.status == "degraded" and "bf16 matmul 400 TFLOP/s < 80% of 650" in v.reason
    v = health.judge(700.0, 2000.0, name=H200, gpu=CALM)
    assert v.status == "degraded" and "copy 2000 GB/s" in v.reason and "matmul" not in v.reason


def test_judge_prefers_the_machines_record():
    record = {"matmul_tflops": 800.0, "copy_gbps": 4200.0, "runs": 3}
    v = health.judge(660.0, 4200.0, name=H200, record=record, gpu=CALM)   # fine for the table, not the record
    assert v.status == "degraded" and v.ref_source == "record (3 runs)" and "85% of 800" in v.reason
    assert health.judge(780.0, 4100.0, name=H200, record=record, gpu=CALM).ok


def test_judge_hard_throttle_and_low_clocks_degrade():
    v = health.judge(700.0, 4200.0, name=H200, gpu={"throttle": "sw_power_cap|hw_slowdown"})
    assert v.status == "degraded" and v.reason == "clocks throttled: hw_slowdown"
    v = health.judge(700.0, 4200.0, name=H200, gpu={"sm_clock_mhz": 900.0, "throttle": ""}, max_sm_clock_mhz=1980)
    assert v.status == "degraded" and "SM clock 900 MHz is 45% of max 1980" in v.reason


def test_judge_other_processes_mean_shared_first():
    others = [{"pid": 4242, "used_mb": 2048.0}]
    v = health.judge(400.0, 4200.0, name=H200, gpu=CALM, other=others)
    assert v.status == "shared" and v.reason.startswith("1 other process(es) on the GPU: pid 4242 (2048 MB)")
    assert "bf16 matmul 400" in v.reason                               # the slowdown is still reported


def test_judge_unknown_gpu_and_strict():
    v = health.judge(100.0, 500.0, name="Tesla T4", gpu={})
    assert v.ok and v.ref_source == "none" and "no reference" in v.reason
    strict = health.judge(100.0, 500.0, name="Tesla T4", gpu={}, strict=True)
    assert strict.status == "degraded" and "strict" in strict.reason
    assert health.judge(580.0, 4200.0, name=H200, gpu=CALM, strict=True).status == "degraded"   # < 90% of 650
    assert health.judge(580.0, 4200.0, name=H200, gpu=CALM).ok


def test_health_record_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv(health.ENV_CACHE, str(tmp_path / "h.json"))
    assert health.health_cache_path() == tmp_path / "h.json"
    assert health.load_record(H200, "GPU-1") is None
    for tf in (700.0, 710.0, 720.0, 730.0, 740.0, 100.0):
        health.save_record(H200, "GPU-1", tf, 4000.0 + tf, driver="580")
    rec = health.load_record(H200, "GPU-1")
    assert rec == {"matmul_tflops": 720.0, "copy_gbps": 4720.0, "runs": 5}   # last 5 runs, median
    assert health.load_record(H200, "GPU-2") is None
    data = json.loads((tmp_path / "h.json").read_text())
    assert data["entries"][f"{H200}|GPU-1"]["runs"][-1]["driver"] == "580"
    (tmp_path / "h.json").write_text("{not json")
    assert health.load_record(H200, "GPU-1") is None


def test_default_health_cache_path_is_beside_the_tuning_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(health.ENV_CACHE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    if sys.platform.startswith("linux"):
        assert health.health_cache_path() == tmp_path / "moda-bench" / "health.json"
    assert health.health_cache_path(tmp_path / "x.json") == tmp_path / "x.json"


def test_check_health_without_a_gpu_is_unknown(monkeypatch):
    monkeypatch.setattr(health, "cuda_available", lambda: False)
    v = health.check_health(0)
    assert v.status == "unknown" and not v.ok and "no CUDA GPU" in v.reason


def _doctor_app():
    app = typer.Typer()
    app.command()(doctor.doctor_command)
    return app


def test_doctor_without_a_gpu_prints_one_line_and_exits_1(monkeypatch):
    monkeypatch.setattr(health, "cuda_available", lambda: False)
    res = CliRunner().invoke(_doctor_app(), [])
    assert res.exit_code == 1
    assert res.output.strip() == doctor.NO_GPU and len(res.output.strip().splitlines()) == 1
    assert "Traceback" not in res.output and res.exception is None or isinstance(res.exception, SystemExit)


@pytest.mark.parametrize("matmul, code, word", [(700.0, 0, "healthy"), (300.0, 1, "degraded")])
def test_doctor_prints_the_verdict_and_exits_by_it(monkeypatch, matmul, code, word):
    seen = {}

    def fake_check(device, **kw):
        seen.update(kw, device=device)
        v = health.judge(matmul, 4200.0, name=H200, gpu=CALM)
        v.header = {"name": H200, "driver": "580.1", "power_limit_w": 700.0, "max_sm_clock_mhz": 1980,
                    "max_mem_clock_mhz": 3201, "ecc": True, "other_processes": []}
        return v
    monkeypatch.setattr(health, "cuda_available", lambda: True)
    monkeypatch.setattr(health, "check_health", fake_check)
    res = CliRunner().invoke(_doctor_app(), ["--device", "1", "--no-record", "--strict"])
    assert res.exit_code == code, res.output
    assert seen == {"device": 1, "record": False, "strict": True, "cache_path": None}
    assert word in res.output and "580.1" in res.output and f"{matmul:.0f} TFLOP/s" in res.output
    assert "host canary (median host us" in res.output and "CPU affinity: " in res.output   # beside the GPU's
    assert "MoDA routes" in res.output                    # which implementation moda_attention runs here


def test_doctor_names_the_moda_route_of_each_standard_shape(monkeypatch):
    from moda_bench.kernels.moda import dispatch
    monkeypatch.setattr(dispatch, "device_gpu", lambda device: H200)
    text = doctor.routes_text(0)
    lines = text.splitlines()
    assert lines[0].startswith("MoDA routes on cuda:0") and len(lines) == 1 + len(doctor.ROUTE_SHAPES)
    assert all("auto -> " in ln for ln in lines[1:])      # on this CPU machine every route falls back to triton
    monkeypatch.setattr(dispatch, "explain", lambda *a, **k: 1 / 0)
    assert doctor.routes_text(0).startswith("MoDA routes: cannot tell (ZeroDivisionError")


def test_doctor_turns_a_canary_crash_into_one_line(monkeypatch):
    def boom(device, **kw):
        raise RuntimeError("CUDA error: an illegal memory access")
    monkeypatch.setattr(health, "cuda_available", lambda: True)
    monkeypatch.setattr(health, "check_health", boom)
    res = CliRunner().invoke(_doctor_app(), [])
    assert res.exit_code == 1 and "illegal memory access" in res.output and "Traceback" not in res.output


@pytest.mark.gpu
def test_check_health_on_the_gpu(tmp_path):
    t0 = time.perf_counter()
    v = health.check_health(0, record=True, cache_path=tmp_path / "h.json")
    assert time.perf_counter() - t0 < 10
    assert v.status in health.STATUSES and v.matmul_tflops > 10 and v.copy_gbps > 50
    assert v.header["name"] and v.reason
    if v.ok:
        assert health.load_record(v.name, v.uuid, tmp_path / "h.json")["runs"] == 1


def test_sampler_tags_each_poll_and_summarises_one_tag():
    """tag=: every poll carries what the tag function returned when it was taken, and
    summary(tagged=x) takes only those polls (all None when x was never seen); summary() still
    covers every poll."""
    state = {"now": None, "sm": 1000}

    def reader():
        return {"sm": state["sm"], "mem": 2000, "power": state["sm"] / 10, "temp": 30, "reasons": 0}
    with health.GpuSampler(interval_s=0.002, reader=reader, tag=lambda: state["now"]) as s:
        for name, sm in (("a", 1500), ("b", 1800), ("a", 1500), ("b", 1800)):
            state.update(now=name, sm=sm)
            time.sleep(0.03)
        state.update(now=None, sm=1000)
    assert {p["tag"] for p in s.polls} >= {"a", "b"}
    a, b = s.summary(tagged="a"), s.summary(tagged="b")
    assert a["sm_clock_mhz"] == 1500.0 and a["power_w"] == 150.0
    assert b["sm_clock_mhz"] == 1800.0 and b["sm_clock_min_mhz"] == 1800.0
    assert all(v is None for v in s.summary(tagged="c").values())
    whole = s.summary()
    assert whole["sm_clock_min_mhz"] <= 1500.0 and whole["sm_clock_mhz"] is not None
    assert set(health.OWN_COLUMNS.values()) <= set(health.GPU_COLUMNS)
