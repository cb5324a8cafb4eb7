"""The MoDA dispatcher (`kernels.moda.dispatch`): decisions from per-GPU rules (device query mocked),
fallbacks where an implementation cannot run, auto == triton on the CPU interpreter, the rules
regenerated from a synthetic sweep CSV, the shipped rules, and the committed `moda` rows of the
Triton kernel read as `moda-triton`."""
from __future__ import annotations

import csv

import pytest
import torch

from moda_bench import results, schema
from moda_bench.kernels.moda import dispatch
from moda_bench.kernels.moda.validate import MoDAShape
from moda_bench.tuning import dispatch_rules

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


def shape(T=4096, G=8, L=64, d=64, B=1, Hk=8):
    return MoDAShape(B=B, T=T, Hq=G * Hk, Hk=Hk, d=d, L=L)


def point(T, ranking, G=8, L=64, d=64, pass_="fwdbwd", depth_grad=1, timer="eager"):
    return {"timer": timer, "pass": pass_, "dtype": "bfloat16", "d": d, "G": G, "L": L, "T": T, "B": 1, "Hk": 8,
            "heads": 8, "depth_grad": depth_grad, "ranking": [{"impl": i, "ms": 1.0} for i in ranking]}


RULES = {"schema_version": 1, "gpu": H100, "timer": "eager", "command": "test", "sources": [], "points": [
    point(2048, ["triton", "fused"]), point(8192, ["fused", "overlap", "triton"]),
    point(16384, ["overlap", "fused"], depth_grad=0), point(16384, ["fa4", "triton"], pass_="fwd"),
    point(4096, ["fa4", "fused"], timer="graph")]}


@pytest.fixture
def gpu(monkeypatch):
    """A fake CUDA GPU named as set (`gpu.name`), every implementation available unless `gpu.missing`
    names it; the test rules installed; memo cleared before and after."""
    class Fake:
        name, missing = H100, set()
    fake = Fake()
    monkeypatch.setattr(dispatch, "device_gpu", lambda device: fake.name)
    monkeypatch.setattr(dispatch, "unavailable", lambda impl, s, dt, dev: (
        dispatch.shape_problem(impl, s, dt) or (f"{impl} missing" if impl in fake.missing else None)))
    dispatch.set_rules(RULES)
    yield fake
    dispatch.set_rules(None)


def pick(T=4096, dtype=torch.bfloat16, training=True, depth_grad=True, graph=False, **kw):
    return dispatch.choose(shape(T=T, **kw), dtype, "cuda:0", training=training, depth_grad=depth_grad, graph=graph)


def test_nearest_measured_point_in_log_T_decides(gpu):
    assert pick(T=1024).impl == "triton"                     # below the grid: the smallest T measured
    assert pick(T=2900).impl == "triton"                     # log2 2900 = 11.50: nearer 2048 (11) than 8192 (13)
    assert pick(T=5000).impl == "fused"                      # log2 5000 = 12.29: nearer 8192 (and 4096's graph
    # point is 0.29 + W_TIMER = 0.79 away, farther than 8192's 0.71)
    assert pick(T=32768).impl == "overlap"                   # beyond the grid: the largest T (16384) measured,
    # 1 doubling + W_GRAD (its point is detached) = MAX_DISTANCE away
    far = pick(T=1 << 20)                                    # farther than MAX_DISTANCE from every point: no guess
    assert far.impl == "triton" and far.reason.startswith("h100 rules: nothing measured near this call")
    assert pick(T=4096, d=128).impl == "triton"              # no head dim 128 measured (W_D = 2 away)
    c = pick(T=8192)
    assert c.detail() == "auto -> fused (h100 rule: nearest measured fwdbwd T=8192 G=8 L=64 d=64 bfloat16)"


def test_pass_timer_and_depth_grad_select_their_points(gpu):
    assert pick(T=4096, graph=True).impl == "fa4"            # a captured call: the graph point there
    assert pick(T=8192, graph=True).impl == "fused"          # no graph point near: eager's (1/2 farther)
    assert pick(T=16384, training=False).impl == "fa4"       # forward-only calls take the fwd points
    assert pick(T=16384, depth_grad=False).impl == "overlap"  # the detached point is nearer
    # attached at 16384: the detached point there (W_GRAD = 0.5 away) is nearer than T=8192's (1 away)
    assert dispatch.distance(dispatch.point_of(shape(T=16384), torch.bfloat16, True), RULES["points"][2]) == 0.5
    assert pick(T=16384).impl == "overlap"


def test_unavailable_implementations_fall_back_in_rank_order(gpu):
    gpu.missing = {"fused"}
    c = pick(T=8192)
    assert (c.impl, c.reason.endswith("; fused unavailable (fused missing)")) == ("overlap", True)   # and why
    gpu.missing = {"fused", "overlap"}
    dispatch.set_rules(RULES)   # clears the memo
    assert pick(T=8192).impl == "triton"
    assert pick(T=8192, G=3).impl == "triton"                # G=3 does not divide 64: the fused path refuses
    assert pick(T=8192, dtype=torch.float32).impl == "triton"  # FA4 takes fp16/bf16 only


def test_gpus_without_rules_cpu_and_named_impls(gpu, tmp_path, monkeypatch):
    dispatch.set_rules(None)
    monkeypatch.setattr(dispatch, "RULES_DIR", tmp_path)
    gpu.name = "NVIDIA A100-SXM4-80GB"
    assert pick(T=8192).impl == "triton" and "no dispatch rules" in pick(T=8192).reason
    cpu = dispatch.choose(shape(), torch.bfloat16, "cpu")
    assert (cpu.impl, cpu.reason) == ("triton", "not a CUDA device (cpu)")
    assert dispatch.choose(shape(), torch.bfloat16, "cuda:0", impl="overlap").impl == "overlap"
    gpu.missing = {"fa4"}
    assert dispatch.choose(shape(), torch.bfloat16, "cuda:0", impl="fa4").reason == "fa4 unavailable: fa4 missing"
    with pytest.raises(ValueError, match="impl must be"):
        dispatch.choose(shape(), torch.bfloat16, "cuda:0", impl="cudnn")


def test_real_availability_off_cuda():
    assert dispatch.unavailable("triton", shape(), torch.bfloat16, "cpu") is None
    assert "needs a CUDA device" in dispatch.unavailable("fused", shape(), torch.bfloat16, "cpu")
    assert "fp16/bf16" in dispatch.unavailable("fa4", shape(), torch.float32, "cpu")


@pytest.mark.parametrize("name", [H100, H200])
def test_shipped_rules_decide_as_measured(name):
    """At every measured fwd+bwd eager point of the paper's T axis, the choice is the rules' fastest there."""
    dispatch.set_rules(None)
    rules = dispatch.rules_for(name)
    measured = [p for p in rules["points"] if (p["pass"], p["timer"], p["G"], p["L"], p["d"], p["B"], p["Hk"],
                                               p["depth_grad"], p["dtype"]) ==
                ("fwdbwd", "eager", 8, 64, 64, 1, 8, 1, "bfloat16")]
    assert len(measured) >= 3
    for p in measured:
        c = dispatch.choose(shape(T=p["T"]), torch.bfloat16, "cpu", gpu=name)
        assert c.impl == p["ranking"][0]["impl"] and f"T={p['T']} G=8 L=64" in c.reason
    assert dispatch.rules_for("NVIDIA H100 PCIe")["gpu"] == H100   # same family, no file of its own
    assert all(line.count("auto -> ") == 1 for line in dispatch.explain(gpu=name)[1:])


def test_auto_equals_triton_on_the_cpu_interpreter():
    """Off CUDA "auto" is the Triton kernel: same out and gradients at an odd shape, both within
    the fp32 tolerance of the fp64 reference."""
    from helpers import random_inputs, rel_err

    from moda_bench.kernels.moda import moda_attention, moda_reference
    q, k, v, kd, vd, do = random_inputs(1, 37, 6, 2, 16, 3, torch.float32, seed=3, dev="cpu")
    outs = []
    for impl in ("auto", "triton"):
        ins = [x.detach().clone().requires_grad_(True) for x in (q, k, v, kd, vd)]
        out = moda_attention(*ins, impl=impl)
        out.backward(do)
        outs.append([out] + [x.grad for x in ins])
    ref = moda_reference(q, k, v, kd, vd, compute_dtype=torch.float64, out_dtype=torch.float64)
    assert rel_err(outs[0][0], ref) < 1e-4
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def _write(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=schema.COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in schema.COLUMNS})


def _row(provider, T, ms, detail="", pass_="fwdbwd", stamp="2026-12-01T00:00:00+00:00", gpu=H100, **kw):
    base = dict(sweep="T", provider=provider, impl_detail=detail, T=T, G=8, Hq=64, Hk=8, L=64, B=1, d=64, C=64,
                dtype="bfloat16", depth_grad=1, Tq=0, S=0, median_ms=ms, status="ok", gpu=gpu, timer="eager",
                torch_version="2", triton_version="3.6.0", git_commit="abc", timestamp=stamp)
    base["pass"] = pass_
    return dict(base, **kw)


def test_legacy_moda_rows_read_as_moda_triton(tmp_path):
    p = tmp_path / "sweep_T.csv"
    _write(p, [_row("moda", 4096, 1.5, "moda_attention block_m=64 (resolved)"),
               _row("moda", 8192, 4.5, "auto -> fused (h100 rule: ...); FA4 sm90 forward"),
               _row("moda", 4096, 0.1, "moda_decode split-KV", pass_="decode"),
               _row("moda-triton", 2048, 0.6, "moda_attention block_m=64 (resolved)")])
    df = results.read_csv(p)
    assert list(df["provider"]) == ["moda-triton", "moda", "moda", "moda-triton"]


def test_rules_regenerated_from_a_sweep_csv(tmp_path):
    p = tmp_path / "sweep_T.csv"
    _write(p, [_row("moda", 2048, 0.60, "moda_attention block_m=64 (resolved)"),   # legacy: triton
               _row("moda-fused", 2048, 0.70), _row("moda-fused", 8192, 4.0), _row("moda-overlap", 8192, 4.02),
               _row("moda-triton", 8192, 5.0), _row("moda-fa4", 8192, 3.0, status="error"),
               _row("moda", 8192, 4.0, "auto -> fused (...)"),                            # the dispatcher: left out
               _row("moda-fused", 8192, 9.0, stamp="2026-11-01T00:00:00+00:00"),          # superseded
               _row("moda-fused", 16384, 15.0), _row("moda-triton", 16384, 14.0, timer="graph"),  # one impl each
               _row("moda-fused", 2048, 0.4, timer="graph"), _row("moda-triton", 2048, 0.5, timer="graph"),
               _row("moda-fused", 4096, 1.3, gpu=H200), _row("moda-triton", 4096, 1.5, gpu=H200)])
    rules = dispatch_rules.build_rules([tmp_path], command="moda-bench dispatch --rules-from x")
    assert sorted(rules) == [H100, H200]
    pts = rules[H100]["points"]
    assert [(q["timer"], q["T"], [e["impl"] for e in q["ranking"]]) for q in pts] == [
        ("eager", 2048, ["triton", "fused"]), ("eager", 8192, ["overlap", "fused", "triton"]),  # 4.02 ties 4.0
        ("graph", 2048, ["fused", "triton"])]
    assert rules[H100]["sources"] == ["sweep_T.csv"] and rules[H100]["command"].startswith("moda-bench dispatch")
    written = dispatch_rules.write_rules(rules, tmp_path / "out")
    assert [w.name for w in written] == ["nvidia-h100-80gb-hbm3.json", "nvidia-h200.json"]
    dispatch.set_rules(written[0])
    try:
        assert dispatch.choose(shape(T=3000), torch.bfloat16, "cpu", gpu=H100).impl == "triton"
        assert dispatch.choose(shape(T=6000), torch.bfloat16, "cpu", gpu=H100).impl == "overlap"
        assert dispatch.choose(shape(T=3000), torch.bfloat16, "cpu", gpu=H100, graph=True).impl == "fused"
    finally:
        dispatch.set_rules(None)
    with pytest.raises(dispatch_rules.RulesError, match="two or more"):
        dispatch_rules.build_rules([tmp_path / "out"])


def test_dispatcher_rows_fill_a_route_no_provider_measured(tmp_path):
    """A run that timed `moda` (auto -> triton) beside `moda-fused` only (FP16, d = 128) gives a point
    with both routes; where the route's own provider was measured, the dispatcher's row is left out."""
    _write(tmp_path / "sweep_T.csv",
           [_row("moda", 4096, 1.6, "auto -> triton (h100 rule: ...); moda_attention block_m=64"),
            _row("moda-fused", 4096, 1.3),
            _row("moda", 8192, 3.0, "auto -> fused (h100 rule: ...)"), _row("moda-fused", 8192, 4.0),
            _row("moda-triton", 8192, 5.0), _row("moda", 16384, 9.0, "auto -> triton (...)")])
    pts = dispatch_rules.build_rules([tmp_path])[H100]["points"]
    assert [(q["T"], [(e["impl"], e["ms"]) for e in q["ranking"]]) for q in pts] == [
        (4096, [("fused", 1.3), ("triton", 1.6)]), (8192, [("fused", 4.0), ("triton", 5.0)])]


def test_moda_provider_is_the_dispatcher_and_moda_triton_the_kernel():
    """On the CPU interpreter `moda` runs moda_attention(impl="auto") -> Triton, its impl_detail says
    so, and its forward equals `moda-triton`'s; a pinned C runs the Triton kernel with that chunk."""
    from moda_bench.bench.providers import get_provider
    from moda_bench.bench.runner import Point
    from moda_bench.timing import make_inputs
    point = Point(T=19, G=2, Hk=2, L=3, d=16, C=16, dtype="float32")
    inputs = make_inputs(1, 19, 4, 2, 16, 3, dtype=torch.float32, device="cpu", seed=0)
    auto = get_provider("moda").prepare(inputs, point, None)
    kernel = get_provider("moda-triton").prepare(inputs, point, None)
    assert auto.impl_detail.startswith("auto -> triton (not a CUDA device (cpu)); moda_attention block_m=")
    assert auto.config["impl"] == "triton"
    assert torch.equal(auto.forward(), kernel.forward())
    pinned = get_provider("moda").prepare(inputs, point, 16)
    assert pinned.impl_detail.startswith("auto -> triton (C=16 pinned: the Triton kernel's block_m); ")
    assert pinned.config["block_m"] == 16


def test_dispatch_command_explains_and_regenerates(tmp_path):
    from typer.testing import CliRunner

    from moda_bench.cli import app
    runner = CliRunner()
    got = runner.invoke(app, ["dispatch", "--gpu", H200])
    assert got.exit_code == 0 and got.output.startswith(f"as on {H200}")
    assert len([line for line in got.output.splitlines() if " auto -> " in line]) == len(dispatch.STANDARD_SHAPES)
    _write(tmp_path / "sweep_T.csv", [_row("moda-fused", 8192, 4.0), _row("moda-triton", 8192, 5.0)])
    got = runner.invoke(app, ["dispatch", "--rules-from", str(tmp_path), "--out", str(tmp_path / "rules")])
    assert got.exit_code == 0 and (tmp_path / "rules" / "nvidia-h100-80gb-hbm3.json").is_file()
    assert "eager fwdbwd T=8192" in got.output and ": fused (fused 4, triton 5 ms)" in got.output
    got = runner.invoke(app, ["dispatch", "--rules-from", str(tmp_path / "rules")])
    assert got.exit_code == 2 and got.output.startswith("dispatch: no point under") and "Traceback" not in got.output


def test_moda_attention_routes_the_choice(monkeypatch):
    """moda_attention hands a non-Triton choice to `run` with the call's arguments, tells `choose`
    whether the call trains, and runs the Triton kernel for impl="triton" or an auto call with a config."""
    from moda_bench.kernels.moda import MoDAConfig, moda_attention
    seen = []
    monkeypatch.setattr(dispatch, "choose", lambda s, dt, dev, **kw: seen.append(("choose", kw)) or
                        dispatch.Choice("fused", "test"))
    monkeypatch.setattr(dispatch, "run", lambda c, *a, **kw: seen.append(("run", c.impl, kw)) or "ran")
    q, k, v = torch.randn(1, 5, 4, 16), torch.randn(1, 5, 2, 16), torch.randn(1, 5, 2, 16)
    kd, vd = torch.randn(1, 5, 3, 2, 16), torch.randn(1, 5, 3, 2, 16)
    assert moda_attention(q, k, v, kd, vd, depth_grad=False, scale=0.5) == "ran"
    assert seen[0] == ("choose", dict(depth_grad=False, training=False, impl="auto", graph=False))
    assert seen[1] == ("run", "fused", dict(scale=0.5, return_lse=False, depth_grad=False, config=None))
    with torch.no_grad():
        moda_attention(q.requires_grad_(True), k, v, kd, vd)
    assert seen[2][1]["training"] is False                   # no grad mode: a forward-only call
    moda_attention(q, k, v, kd, vd)
    assert seen[4][1]["training"] is True
    n = len(seen)
    assert moda_attention(q, k, v, kd, vd, impl="triton").shape == q.shape
    assert moda_attention(q, k, v, kd, vd, config=MoDAConfig()).shape == q.shape
    assert len(seen) == n                                     # neither asked the dispatcher


def test_a_bad_rules_file_is_a_one_line_error(tmp_path):
    bad = tmp_path / "rules.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="rules.json: cannot read MoDA dispatch rules"):
        dispatch.set_rules(bad)
    bad.write_text('{"points": []}')
    with pytest.raises(ValueError, match="not a MoDA dispatch rules file"):
        dispatch.read_rules(bad)
