"""Each timed row's own GPU state (own_sm_clock_mhz, own_power_w): bench.point.time_interleaved
tags every NVML poll with the provider whose repetitions are running, so a provider that runs at
lower clocks than its peers of the point shows it in its row, beside the point's columns. On the
CPU: stand-in samplers and a stand-in NVML reader."""
from __future__ import annotations

import functools
import math
import time

from moda_bench import health, schema, timing
from moda_bench.bench.point import Staged, TimingOptions, time_interleaved

CLOCKS = {"fa2": 1800, "moda": 1500}


def test_rows_get_the_clock_and_power_of_their_own_repetitions(monkeypatch):
    state = {"sm": 1980}

    def reader():
        return {"sm": state["sm"], "mem": 3201, "power": state["sm"] / 3, "temp": 50, "reasons": 0}

    def make_sampler(fn, timer="eager", grad_to_none=None):
        name = fn()

        def sample():  # a repetition: the GPU runs this provider's work at its clock for 4 ms
            state["sm"] = CLOCKS[name]
            time.sleep(0.004)
            state["sm"] = 1980
            return 4.0
        return sample

    monkeypatch.setattr(timing, "make_sampler", make_sampler)
    monkeypatch.setattr(timing, "warmup", lambda s, warmup_s=0.0: 4.0)
    monkeypatch.setattr(health, "GpuSampler", functools.partial(health.GpuSampler, interval_s=0.001, reader=reader))
    staged = {n: Staged(row={"provider": n}, fn=lambda n=n: n, grads=[], flops=1e9) for n in CLOCKS}
    opts = TimingOptions(min_samples=10, warmup_ms=0.0, min_time_ms=40.0, max_time_s=2.0)
    result = time_interleaved(staged, opts, device_index=0)
    assert result is not None
    rows = {n: st.row for n, st in staged.items()}
    assert set(health.OWN_COLUMNS) <= set(schema.COLUMNS)
    for name, sm in CLOCKS.items():
        row = rows[name]
        assert row["status"] == schema.OK
        assert row["own_sm_clock_mhz"] == sm and math.isclose(row["own_power_w"], sm / 3)
    # the point's columns are shared by both rows and lie between the two providers' clocks
    assert rows["fa2"]["sm_clock_mhz"] == rows["moda"]["sm_clock_mhz"]
    assert rows["moda"]["sm_clock_min_mhz"] == 1500


def test_without_nvml_the_own_columns_are_empty(monkeypatch):
    monkeypatch.setattr(timing, "make_sampler", lambda fn, timer="eager", grad_to_none=None: (lambda: 1.0))
    monkeypatch.setattr(timing, "warmup", lambda s, warmup_s=0.0: 1.0)
    monkeypatch.setattr(health, "GpuSampler", functools.partial(health.GpuSampler, reader=None))
    monkeypatch.setattr(health, "nvml_reader", lambda handle: None)
    staged = {n: Staged(row={"provider": n}, fn=lambda: None, grads=[], flops=1.0) for n in ("fa2", "moda")}
    time_interleaved(staged, TimingOptions(min_samples=2, warmup_ms=0.0, min_time_ms=0.0, max_time_s=0.5), 0)
    for st in staged.values():
        assert st.row["own_sm_clock_mhz"] is None and st.row["own_power_w"] is None
