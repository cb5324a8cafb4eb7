"""experiments/ladder_ncu.py's summary: ncu's raw CSV cut into rungs at the marker kernels."""
from __future__ import annotations

import json

import pytest
from ladder_ncu import main, read_raw, summarize

HEADER = ('"ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum","dram__bytes_write.sum",'
          '"lts__t_sector_hit_rate.pct","sm__warps_active.avg.pct_of_peak_sustained_active",'
          '"launch__registers_per_thread"')
UNITS = '"","","ns","byte","byte","%","%","register/thread"'


def _raw() -> str:
    rows = [(0, "_ladder_marker", 1000, 0, 0, 0, 0, 16),
            (1, "_fwd_kernel", 3000, "2,000,000", 1000000, 50, 40, 128),
            (2, "_bwd_dq_kernel", 1000, 1000000, 0, 90, 80, 160),
            (3, "_ladder_marker", 1000, 0, 0, 0, 0, 16),
            (4, "moda_fwd_kernel", 2000, 500000, 500000, 70, 30, 96),
            (5, "_ladder_marker", 1000, 0, 0, 0, 0, 16)]
    body = "\n".join(",".join(f'"{c}"' for c in r) for r in rows)
    return f"==PROF== Connected to process\n{HEADER}\n{UNITS}\n{body}\n"


def test_summary_cuts_at_markers_and_weights_rates_by_time():
    out = summarize(read_raw(_raw()), ["group-aware", "shipped-kernel"])
    assert [r["rung"] for r in out] == ["group-aware", "shipped-kernel"]
    ga = out[0]
    assert ga["kernels"] == 2 and ga["time_ms"] == pytest.approx(0.004)
    assert ga["dram_read_MB"] == pytest.approx(3.0) and ga["dram_write_MB"] == pytest.approx(1.0)
    assert ga["l2_hit_pct"] == pytest.approx((50 * 3 + 90 * 1) / 4)
    assert ga["achieved_occupancy_pct"] == pytest.approx((40 * 3 + 80 * 1) / 4) and ga["max_regs"] == 160
    assert out[1]["kernels"] == 1 and out[1]["l2_hit_pct"] == pytest.approx(70)


def test_main_writes_the_summary_csv(tmp_path):
    (tmp_path / "raw.csv").write_text(_raw())
    (tmp_path / "order.json").write_text(json.dumps({"T": 4096, "rungs": ["group-aware", "shipped-kernel"]}))
    assert main(["--summarize", str(tmp_path / "raw.csv"), "--order", str(tmp_path / "order.json"),
                 "--out", str(tmp_path / "s.csv")]) == 0
    lines = (tmp_path / "s.csv").read_text().splitlines()
    assert lines[0].startswith("T,rung,kernels") and lines[1].startswith("4096,group-aware,2,")
    (tmp_path / "none.csv").write_text(HEADER + "\n")
    assert main(["--summarize", str(tmp_path / "none.csv"), "--order", str(tmp_path / "order.json")]) == 1
