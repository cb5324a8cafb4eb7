"""The ablation ladder: every rung against the fp64 reference (forward and all five gradients),
the ladder kernel's switches one at a time, the cumulative shipped-kernel configs, the
depth-utilisation formulas, and the `ablate` command's outputs and no-CUDA error.

Triton rungs run on the CPU interpreter (TRITON_INTERPRET=1 is set here before triton is
imported, when no GPU is present). Tolerances, as ||x - ref|| / ||ref||: fp32 1e-3, bf16 2e-2.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from moda_bench.kernels.moda.ladder.kernel import Ideas, moda_ladder  # noqa: E402
from moda_bench.kernels.moda.ladder.table import RUNGS, rung  # noqa: E402
from moda_bench.kernels.moda.reference import moda_reference  # noqa: E402
from moda_bench.timing import max_rel_err  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-3, torch.bfloat16: 2e-2}
REPO = Path(__file__).resolve().parents[1]

# (B, T, G, Hk, L, d, C, dtype): multi-chunk ragged T, T = 1, L = 0, MHA and GQA, one d = 64, an odd G
# (padded rows) with a depth step straddling two chunks (L = 5: P*L not a multiple of the step)
CASES = [
    (1, 33, 2, 2, 3, 16, 16, torch.float32),
    (2, 7, 1, 1, 0, 32, 16, torch.float32),
    (1, 1, 4, 1, 1, 16, 16, torch.float32),
    (2, 33, 4, 1, 3, 32, 32, torch.bfloat16),
    (1, 20, 2, 1, 1, 64, 32, torch.float32),
    (1, 19, 3, 1, 5, 16, 16, torch.float32),
]


def _case_id(c) -> str:
    B, T, G, Hk, L, d, C, dt = c
    return f"B{B}-T{T}-G{G}-Hk{Hk}-L{L}-d{d}-C{C}-{str(dt).split('.')[-1]}"


def _inputs(B, T, G, Hk, L, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=DEVICE, dtype=dtype).requires_grad_()

    ins = [rnd(B, T, G * Hk, d), rnd(B, T, Hk, d), rnd(B, T, Hk, d)]
    ins += [rnd(B, T, L, Hk, d), rnd(B, T, L, Hk, d)] if L > 0 else [None, None]
    do = torch.randn(B, T, G * Hk, d, generator=g).to(device=DEVICE, dtype=dtype)
    return ins, do


def _grads(out, ins, do):
    used = [t for t in ins if t is not None]
    return torch.autograd.grad(out, used, do)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
@pytest.mark.parametrize("name", [r.name for r in RUNGS])
def test_rung_matches_reference(name, case):
    r = rung(name)
    B, T, G, Hk, L, d, C, dtype = case
    ins, do = _inputs(B, T, G, Hk, L, d, dtype)
    ref = moda_reference(*ins, out_dtype=torch.float64)
    ref_grads = _grads(ref, ins, do.double())
    out = r.fn(*ins, chunk=C)
    assert out.shape == (B, T, G * Hk, d) and out.dtype == dtype
    grads = _grads(out, ins, do)
    tol = TOL[dtype]
    names = ["out", "dq", "dk", "dv", "dk_depth", "dv_depth"]
    errs = {n: max_rel_err(x.detach(), y.detach()) for n, x, y in zip(names, (out, *grads), (ref, *ref_grads))}
    bad = {n: e for n, e in errs.items() if not e <= tol}
    assert not bad, f"{name} {_case_id(case)}: relative errors above {tol}: {bad}"


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1024, 1000])
@pytest.mark.parametrize("name", [r.name for r in RUNGS if r.name != "naive-torch"])
def test_gpu_rung_at_the_paper_shape(name, T):
    """Each Triton rung at the paper's tiles (G=8, Hk=8, d=64, L=64, C=64, bf16; T=1000 ragged) against an
    fp32 reference on the GPU (as the kernel's own GPU tests; fp64 would be slow at this size)."""
    from helpers import check_against_reference
    r = rung(name)
    check_against_reference(lambda *a: r.fn(*a, chunk=64), 1, T, 64, 8, 64, 64, torch.bfloat16,
                            ref_dtype=torch.float32)


def test_explicit_scale_and_empty_depth_tensors():
    """A non-default scale, and L = 0 given as empty depth tensors (zero-size gradients), for every switch set."""
    ins, do = _inputs(1, 9, 2, 1, 0, 16, torch.float32, seed=3)
    kd = torch.zeros(1, 9, 0, 1, 16, requires_grad=True, device=DEVICE)
    vd = torch.zeros_like(kd, requires_grad=True)
    ref = moda_reference(ins[0], ins[1], ins[2], scale=0.3, out_dtype=torch.float64)
    for ideas in (Ideas(span_all=True), Ideas(), Ideas(grouped=True), Ideas(grouped=True, depth_in_dq=True)):
        out = moda_ladder(ins[0], ins[1], ins[2], kd, vd, scale=0.3, chunk=16, ideas=ideas)
        assert max_rel_err(out.detach(), ref.detach()) < 1e-4
        gkd, gvd = torch.autograd.grad(out, [kd, vd], do)
        assert gkd.shape == kd.shape and gvd.shape == vd.shape


def test_ladder_rungs_differ_by_one_switch():
    """Rungs 2-5 are the same kernel with one more switch on at each rung; rungs 6-9 each add fields to the
    config of the rung before, in the order the module says."""
    from moda_bench.kernels.moda.ladder import shipped
    from moda_bench.kernels.moda.ladder.table import CHUNK, FLASH, GROUP, GROUP_BWD
    from moda_bench.kernels.moda.validate import MoDAShape
    ladder = [FLASH, CHUNK, GROUP, GROUP_BWD]
    for a, b in zip(ladder, ladder[1:]):
        diff = [f for f in ("span_all", "grouped", "depth_in_dq") if getattr(a, f) != getattr(b, f)]
        assert len(diff) == 1, (a, b)
    shape = MoDAShape(B=1, T=4096, Hq=64, Hk=8, d=64, L=64)
    cfgs = [shipped.step_config(s, shape, 64).to_dict() for s in shipped.STEPS]
    changed = [{k for k in a if a[k] != b[k]} for a, b in zip(cfgs, cfgs[1:])]
    assert changed[0] == {"depth_sub"} and (cfgs[0]["depth_sub"], cfgs[1]["depth_sub"]) == (8, 0)
    assert "fwd_depth" in changed[1] and not any(k.startswith("bwd") for k in changed[1])
    assert "bwd_depth" in changed[2] and all(k.startswith("bwd") for k in changed[2])
    assert (cfgs[0]["fwd_depth"], cfgs[0]["bwd_depth"], cfgs[2]["fwd_depth"], cfgs[3]["bwd_depth"]) == \
        ("fused", "fused", "tma", "tma")


def test_tma_rungs_match_the_hopper_default(monkeypatch):
    """The descriptor rungs' fields are those `default_config` sets on Hopper (checked by making the
    heuristic believe it runs on one), so the rungs follow the shipped kernel's defaults."""
    from moda_bench.kernels.moda import config
    from moda_bench.kernels.moda.ladder import shipped
    from moda_bench.kernels.moda.validate import MoDAShape
    monkeypatch.setattr(config, "_descriptor_gpu", lambda dtype=None: True)
    for T in (1024, 4096, 16384):
        shape = MoDAShape(B=1, T=T, Hq=64, Hk=8, d=64, L=64)
        want = config.default_config(shape, "bfloat16")
        got = shipped.step_config("tma-bwd", shape, want.block_m)
        fields = list(shipped._tma_fwd(shape, 64)) + list(shipped._tma_bwd(shape, 64)) + ["bwd_q_block_m", "block_m"]
        assert {f: getattr(got, f) for f in fields} == {f: getattr(want, f) for f in fields}, T


def test_bad_arguments_raise_value_errors():
    ins, _ = _inputs(1, 4, 1, 1, 1, 16, torch.float32)
    with pytest.raises(ValueError, match="chunk"):
        rung("chunk-aware").fn(*ins, chunk=24)
    with pytest.raises(ValueError, match="depth_in_dq"):
        moda_ladder(*ins, ideas=Ideas(depth_in_dq=True))
    ins32, _ = _inputs(1, 4, 32, 1, 1, 16, torch.float32)
    with pytest.raises(ValueError, match="padded group size"):
        rung("group-aware").fn(*ins32, chunk=16)
    with pytest.raises(ValueError, match="unknown rung"):
        rung("fastest")
    with pytest.raises(ValueError, match="k_depth"):
        rung("naive-torch").fn(ins[0], ins[1], ins[2], ins[3][:, :2], ins[4][:, :2])


def test_depth_utilization_at_paper_config():
    """T=1024, G=8, C=64, L=64: 1, 1/T, 1/C, G/C (rungs 4-6), then min(1, G/16) (spec sections 2-3)."""
    got = {r.name: r.depth_utilization(1024, 8, 64, 64) for r in RUNGS}
    want = {"naive-torch": 1.0, "flash-compatible": 1 / 1024, "chunk-aware": 1 / 64, "group-aware": 8 / 64,
            "depth-bwd-in-dq": 8 / 64, "shipped-kernel": 8 / 64, "batched-tiles": 8 / 16, "tma-fwd": 8 / 16,
            "tma-bwd": 8 / 16, "ours": 8 / 16}
    assert got == pytest.approx(want)
    assert rung("batched-tiles").depth_utilization(1024, 16, 64, 64) == pytest.approx(1.0)
    # 4 positions x 3 entries = 12 columns padded to one 16-column step: 4*4*3 useful of 64*16
    assert rung("group-aware").depth_utilization(1024, 4, 64, 3) == pytest.approx(4 * 4 * 3 / (64 * 16))
    assert all(math.isnan(r.depth_utilization(1024, 8, 64, 0)) for r in RUNGS)


def test_rung_order_and_paper_times_match_reference_csv():
    import pandas as pd
    assert [r.name for r in RUNGS] == ["naive-torch", "flash-compatible", "chunk-aware", "group-aware",
                                       "depth-bwd-in-dq", "shipped-kernel", "batched-tiles", "tma-fwd", "tma-bwd",
                                       "ours"]
    paper = pd.read_csv(REPO / "results" / "reference" / "paper_a100_ablation.csv")
    table = dict(zip(paper["implementation"], paper["ms"]))
    for r in RUNGS[:4]:
        assert r.paper_ms == pytest.approx(table[r.name])
    assert all(r.paper_ms is None for r in RUNGS[4:]) and all(r.idea for r in RUNGS)


def _fake_rows():
    """Schema rows as run_one returns them (made-up timings), with one rung skipped."""
    from moda_bench import schema
    meta = schema.run_metadata()
    rows = []
    for r, ms in zip(RUNGS, [812.0, 11.0, 5.5, 1.2, 1.1, 1.05, 1.0, 0.95, 0.92, 0.9]):
        row = {c: math.nan for c in schema.COLUMNS}
        row.update(meta, sweep="ablation", provider=r.name, impl_detail=r.label, status=schema.OK, reason="",
                   config="{}", median_ms=ms, p20_ms=0.9 * ms, p80_ms=1.1 * ms, max_rel_err=1e-3,
                   depth_utilization=r.depth_utilization(1024, 8, 64, 64),
                   **{"pass": "fwdbwd", "T": 1024, "G": 8, "Hq": 64, "Hk": 8, "L": 64, "B": 1, "d": 64, "C": 64,
                      "dtype": "bfloat16"})
        rows.append(row)
    return rows


def test_ablation_table_csv_and_chart(tmp_path):
    """CSV rows follow schema.COLUMNS and are upserted on the row key; the chart sits beside it."""
    import pandas as pd

    from moda_bench import schema
    from moda_bench.bench.ablate import ablation_frame
    from moda_bench.cli.ablate import ablation_table, write_outputs
    rows = _fake_rows()
    frame = ablation_frame(rows)
    assert list(frame.columns) == schema.COLUMNS
    table = ablation_table(frame)
    assert table.row_count == len(RUNGS)
    csv_path, figures = write_outputs(frame, tmp_path)
    again = pd.read_csv(csv_path)
    assert list(again.columns) == schema.COLUMNS and list(again["provider"]) == [r.name for r in RUNGS]
    assert again.loc[again.provider == "chunk-aware", "depth_utilization"].item() == pytest.approx(1 / 64)
    rows[0].update(status=schema.SKIPPED, reason="--skip-naive", median_ms=math.nan)
    rows[1]["median_ms"] = 10.0
    write_outputs(ablation_frame(rows), tmp_path)  # re-run: replaces by key, keeps the earlier naive row
    again = pd.read_csv(csv_path)
    assert len(again) == len(RUNGS)
    assert again.set_index("provider")["median_ms"].to_dict()["flash-compatible"] == 10.0
    assert again.set_index("provider")["status"].to_dict()["naive-torch"] == "ok"
    png = [p for p in figures if p.suffix == ".png"]
    assert png and png[0].parent == tmp_path and png[0].stat().st_size > 1000


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error path")
def test_ablate_without_cuda_exits_nonzero():
    import typer
    from typer.testing import CliRunner

    from moda_bench.cli.ablate import ablate_command
    app = typer.Typer()
    app.command()(ablate_command)
    res = CliRunner().invoke(app, ["--T", "64"])
    assert res.exit_code != 0
    assert "CUDA" in res.output and "Traceback" not in res.output
