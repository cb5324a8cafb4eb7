"""Issue 58, item 5: `sweep --vary T`'s default providers include moda-fused, which is skipped
with its reason (FA4 missing, no CUDA, not sm90) wherever it cannot run."""
from __future__ import annotations

from moda_bench.bench import providers
from moda_bench.bench.runner import Point, plan_points, run_sweep
from moda_bench.bench.spec import RunSpec


def test_defaults_include_moda_fused_after_moda_fa4():
    names = providers.DEFAULT_PROVIDERS
    assert "moda-fused" in names and names.index("moda-fused") == names.index("moda-fa4") + 1
    assert [p.name for p in providers.resolve_providers(",".join(names))] == names


def test_moda_fused_skipped_with_its_reason_on_cpu(tmp_path):
    reason = providers.get_provider("moda-fused").unavailable("cpu")
    assert isinstance(reason, str) and reason.strip()
    frame = run_sweep(plan_points("T", [24], Point(T=24, G=2, Hk=2, L=3, B=1, d=16, C=16, dtype="float32")),
                      RunSpec(("moda-fused",), "fwd"), tmp_path / "sweep_T.csv", sweep_name="T", device="cpu",
                      timer=lambda fn, **kw: {"median_ms": 1.0, "p20_ms": 1.0, "p80_ms": 1.0}, progress=False)
    row = frame.iloc[0]
    assert (row["provider"], row["status"]) == ("moda-fused", "skipped")
    assert row["reason"] == reason
