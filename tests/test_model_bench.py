"""`moda-bench model` end to end on the CPU: the smoke model's steps run and write model rows, the
profile breakdown, the report's MODELS.md from those files, and one-line user errors."""
import math

import pytest
from typer.testing import CliRunner

from moda_bench import results, schema
from moda_bench.bench import model as bm
from moda_bench.bench.model_profile import profile_hook
from moda_bench.cli import app
from moda_bench.models.flops import generate_flops, param_count, train_flops
from moda_bench.reports.report import generate_report

CHEAP = ("vanilla", "depth-attention-torch", "denseformer", "attnres", "mhc")   # no interpreted kernels


def one_sample(fn, grad_to_none=None, warmup_ms=0.0, rep_ms=0.0):
    return bm.cpu_timer(fn, samples=1)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A training run (with the profile) and a generation run of the smoke model, 2 layers, T=8."""
    out = tmp_path_factory.mktemp("model")
    train = bm.ModelSpec("smoke", CHEAP, layers=2, seq_len=8, batch=2, grad_accum=2)
    hook = profile_hook(train, out / f"profile_{train.label}.csv")
    frame = bm.run_model(train, out / f"model_{train.label}.csv", device="cpu", progress=False, timer=one_sample,
                         on_model=hook)
    gen = bm.ModelSpec("smoke", ("vanilla", "depth-attention-torch", "mhc"), mode="generate", layers=2, seq_len=8,
                       new_tokens=3)
    gframe = bm.run_model(gen, out / f"model_{gen.label}.csv", device="cpu", progress=False, timer=one_sample)
    return out, train, frame, gen, gframe


def test_the_smoke_train_step_runs_every_variant_and_writes_its_rows(runs):
    out, spec, frame, _, _ = runs
    cfg = spec.config()
    assert list(frame["status"]) == ["ok"] * len(CHEAP), frame[["provider", "reason"]]
    back = results.read_models([out])
    train = back[back["pass"] == "train"]
    assert len(train) == len(CHEAP)
    assert set(train["provider"]) == set(CHEAP) and (train["depth_grad"] == 1).all()
    for r in train.to_dict("records"):
        assert r["step_ms"] > 0 and r["tokens_per_s"] == pytest.approx(2 * 8 * 2 / (r["step_ms"] / 1e3))
        assert r["model_flops"] == pytest.approx(train_flops(cfg, r["provider"], 2, 8, 2))
        assert r["params"] == param_count(cfg, r["provider"])
        assert (r["layers"], r["layers_total"], r["T"], r["grad_accum"]) == (2, 4, 8, 2)
        assert math.isnan(r["mfu"])   # no GPU peak off CUDA
        assert r["gpu"].startswith("cpu") and r["git_commit"]
    vanilla = train[train["provider"] == "vanilla"].iloc[0]
    assert vanilla["ratio_to_vanilla"] == 1.0
    detached = bm.base_row(spec, cfg, bm.DETACHED, {"gpu": "cpu"})
    assert (detached["provider"], detached["depth_grad"]) == ("moda", 0)
    assert detached["depth_kv_gb"] == pytest.approx(2 * 8 * 2 * 2 * 32 * 4 * 2 / 1e9)   # B T entries Hk d bytes 2
    assert detached["params"] == param_count(cfg, "moda")


def test_generation_rows_count_generated_tokens(runs):
    _, _, _, spec, frame = runs
    cfg = spec.config()
    assert list(frame["status"]) == ["ok"] * 3
    for r in frame.to_dict("records"):
        assert r["new_tokens"] == 3 and r["pass"] == "generate"
        assert r["tokens_per_s"] == pytest.approx(1 * 3 / (r["step_ms"] / 1e3))
        assert r["model_flops"] == pytest.approx(generate_flops(cfg, r["provider"], 1, 8, 3))


def test_the_profile_splits_each_step_into_the_labelled_categories(runs):
    out, _, _, _, _ = runs
    prof = results.read_profiles([out])
    assert set(prof["provider"]) == set(CHEAP)
    for _, g in prof.groupby("provider"):
        assert g["share"].sum() == pytest.approx(1.0)
        assert (g["ms"] >= 0).all()
        cats = dict(zip(g["category"], g["ms"]))
        assert cats["attention"] > 0 and cats["ffn"] > 0 and cats["projections"] > 0 and cats["optimizer"] > 0
    mhc = prof[prof["provider"] == "mhc"].set_index("category")["ms"]
    assert mhc["residual-mix"] > 0
    vanilla = prof[prof["provider"] == "vanilla"].set_index("category")["ms"]
    assert vanilla["ffn-kv"] == vanilla["depth-kv"] == 0   # every label has its row, MoDA's empty in vanilla


def test_the_report_writes_models_md_from_model_files_alone(runs, tmp_path):
    out, *_ = runs
    written = generate_report([out], tmp_path / "report")
    names = {p.name for p in written}
    assert "MODELS.md" in names and any(n.startswith("model_profile-") and n.endswith(".png") for n in names)
    text = (tmp_path / "report" / "MODELS.md").read_text()
    assert "### Training step: smoke, 2 of 4 layers, B=2, T=8, grad_accum 2" in text
    assert "whole-model est. ms (x2.00)" in text and "| mhc | ok |" in text
    assert "Sequence attention of every variant: `" in text   # which kernel vanilla and the variants ran
    assert "### Generation: smoke, 2 of 4 layers, B=1, T=8, 3 new tokens" in text
    assert "### Depth-KV memory" not in text   # no CUDA peaks: no measured memory to compare
    assert generate_report([out], tmp_path / "again") and (tmp_path / "again" / "MODELS.md").read_text() == text


def test_presets_and_specs_reject_what_does_not_exist(tmp_path):
    assert set(bm.model_presets()) == {"smoke", "seed002-train", "seed000-moda", "seed002-generate"}
    assert [s.model for s in bm.preset_specs("seed002-train")] == ["dattn-1.5b", "dattn-3b"]
    gen = bm.preset_specs("seed002-generate")[0]
    assert (gen.mode, gen.batch, gen.new_tokens, gen.variants) == ("generate", 64, 2048, ("vanilla", "depth-attention"))
    own = tmp_path / "mine.toml"
    own.write_text('[[run]]\nmodel = "smoke"\nvariants = ["vanilla", "moda"]\nlayers = 2\n')
    assert [(s.model, s.variants, s.layers) for s in bm.preset_specs(str(own))] == [("smoke", ("vanilla", "moda"), 2)]
    own.write_text('[[run]]\nmodel = "smoke"\nlayer = 2\n')
    with pytest.raises(ValueError, match=r"mine.toml: run\[0\].layer: unknown key"):
        bm.preset_specs(str(own))
    assert all(s.layers == 12 for s in bm.preset_specs("seed000-moda", layers=12))
    with pytest.raises(ValueError, match="unknown model preset 'nope'"):
        bm.preset_specs("nope")
    with pytest.raises(ValueError, match="variants must be among"):
        bm.ModelSpec("smoke", ("vanilla", "moda2"))
    with pytest.raises(ValueError, match="--layers must be between 1 and 48"):
        bm.ModelSpec("dattn-3b", layers=49).config()
    assert schema.MODEL_MODES == ("train", "prefill", "generate")


@pytest.mark.parametrize("args, message", [
    (["--model", "nope"], "unknown model 'nope'"),
    (["--variants", "vanilla,fa9"], "variants must be among"),
    (["--mode", "serve"], "mode must be one of train, prefill, generate"),
    (["--preset", "nope"], "unknown model preset"),
    (["--layers", "9"], "--layers must be between 1 and 4"),
    (["--moda-impl", "fa5"], "moda_impl must be auto or one of triton, fa4, overlap, fused"),
])
def test_user_mistakes_are_one_line_errors(args, message):
    res = CliRunner().invoke(app, ["model"] + args)
    assert res.exit_code == 2
    assert message in " ".join(res.output.split()) and "Traceback" not in res.output


@pytest.mark.slow
def test_the_compiled_step_runs_through_the_depth_buffer(tmp_path):
    """--compile: torch.compile of the loss, the depth buffer's ops included; each row records
    its graph breaks (none), an eager row none (blank). MoDA alone: vanilla's compile is
    tests/test_model_compile.py's."""
    spec = bm.ModelSpec("smoke", ("moda",), layers=2, seq_len=8, compile=True)
    frame = bm.run_model(spec, tmp_path / "model.csv", device="cpu", progress=False, timer=one_sample)
    assert list(frame["status"]) == ["ok"] and (frame["compiled"] == 1).all()
    assert list(frame["graph_breaks"]) == [0]
    eager = bm.run_model(spec.replace(compile=False, variants=("vanilla",)), tmp_path / "eager.csv", device="cpu",
                         progress=False, timer=one_sample)
    assert eager["graph_breaks"].isna().all()


def test_prefill_rows_count_the_prompt_tokens(tmp_path):
    from moda_bench.models.flops import prefill_flops
    spec = bm.ModelSpec("smoke", ("vanilla", "mhc"), mode="prefill", layers=2, seq_len=8, batch=2)
    frame = bm.run_model(spec, tmp_path / "model.csv", device="cpu", progress=False, timer=one_sample)
    assert list(frame["status"]) == ["ok", "ok"]
    for r in frame.to_dict("records"):
        assert r["tokens_per_s"] == pytest.approx(2 * 8 / (r["step_ms"] / 1e3))
        assert r["model_flops"] == pytest.approx(prefill_flops(spec.config(), r["provider"], 2, 8))


def test_resume_keeps_finished_runs_refuses_another_commit_and_reruns_a_cut_one(tmp_path, monkeypatch):
    """`model --resume`: a run whose CSV holds every variant is kept; rows of another commit are
    refused with one line; a cut run (some variants missing) runs again from the start."""
    from moda_bench.bench import runstate
    meta = schema.run_metadata()
    spec = bm.ModelSpec("smoke", ("vanilla", "moda", "moda-detached"), layers=2, seq_len=8)
    csv = tmp_path / f"model_{spec.label}.csv"
    assert bm.resume_state(spec, csv, gpu=meta["gpu"], commit=meta["git_commit"]) == "run"
    bm.run_model(spec, csv, device="cpu", progress=False, timer=one_sample)
    before = csv.read_text()
    assert bm.resume_state(spec, csv, gpu=meta["gpu"], commit=meta["git_commit"]) == "done"
    assert csv.read_text() == before
    with pytest.raises(runstate.ResumeRefused, match="another commit|at commit .*add --allow-commit-change"):
        bm.resume_state(spec, csv, gpu=meta["gpu"], commit="0123abc")
    assert bm.resume_state(spec, csv, gpu=meta["gpu"], commit="0123abc", allow_commit_change=True) == "done"
    lines = before.splitlines()
    csv.write_text("\n".join(lines[:2]) + "\n")   # cut after the first variant's row
    assert bm.resume_state(spec, csv, gpu=meta["gpu"], commit=meta["git_commit"]) == "run"
    assert not csv.exists()


def test_model_cli_resume_skips_done_runs_and_a_second_writer_is_refused(tmp_path):
    from moda_bench.bench import runstate
    args = ["model", "--model", "smoke", "--layers", "2", "--seq-len", "8", "--variants", "vanilla,moda",
            "--quick", "--max-time-s", "1", "--out", str(tmp_path)]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    again = CliRunner().invoke(app, args + ["--resume"])
    assert again.exit_code == 0 and "done in the run being resumed" in again.output, again.output
    import subprocess
    import sys
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        lock = runstate.RunLock(tmp_path, "another moda-bench model")
        lock.info["pid"] = holder.pid
        lock.acquire()
        refused = CliRunner().invoke(app, args + ["--resume"])
        assert refused.exit_code == 2 and "is being written by" in refused.output, refused.output
    finally:
        holder.kill()
        (tmp_path / runstate.LOCK_NAME).unlink(missing_ok=True)
    assert len(list(tmp_path.glob("model_*.csv"))) == 1


def test_moda_rows_name_the_route_of_each_layer(tmp_path, monkeypatch):
    """impl_detail says which implementation each MoDA layer ran (here: triton, the only one off
    CUDA), grouped by implementation with the layers' depth-slot counts; MODELS.md repeats it;
    a mocked dispatcher's mixed choice is grouped; compiled rows name the custom op."""
    from moda_bench.kernels.moda import dispatch
    from moda_bench.models import Decoder
    from moda_bench.reports.models import moda_lines
    spec = bm.ModelSpec("smoke", ("vanilla", "moda", "moda-detached"), layers=2, seq_len=8)
    frame = bm.run_model(spec, tmp_path / "model.csv", device="cpu", progress=False, timer=one_sample)
    detail = dict(zip(frame["depth_grad"].astype(str) + frame["provider"], frame["impl_detail"]))
    want = "moda: auto -> triton for L=0..2 (2 layers; not a CUDA device (cpu)), depth "
    assert detail["1moda"].endswith("; " + want + "attached") and detail["0moda"].endswith("; " + want + "detached")
    assert moda_lines(frame) == [f"MoDA attention, moda: `{want}attached`; moda (detached): `{want}detached`."]
    assert moda_lines(frame[frame["provider"] == "vanilla"]) == []
    import pandas as pd

    from moda_bench.reports.models import train_markdown
    pinned = spec.replace(moda_impl="triton").label
    assert pinned == "smoke-train-moda-triton"
    heads = [line for line in train_markdown(pd.concat([frame, frame.assign(sweep=f"model-{pinned}")]))
             if line.startswith("### ")]
    assert len(heads) == 2 and heads[0].endswith("(run smoke-train)") and heads[1].endswith(f"(run {pinned})")

    model = Decoder(spec.config(), ("moda",), moda_impl="fa4")
    text = bm.impl_detail(model, "moda", spec.replace(moda_impl="fa4"))
    assert text.endswith("moda: fa4 -> triton for L=0..2 (2 layers; fa4 unavailable: fa4: FA4 takes fp16/bf16, not "
                         "float32), depth attached")
    monkeypatch.setattr(dispatch, "choose", lambda shape, *a, **kw: dispatch.Choice(
        "fused" if shape.L else "fa4", f"rule at L={shape.L}"))
    spec4 = bm.ModelSpec("smoke", ("moda",), seq_len=8, mode="prefill")
    from moda_bench.models.decoder import IN_PLACE_REASON
    text = bm.impl_detail(Decoder(spec4.config(), ("moda",)), "moda", spec4)
    assert text.endswith(f"; moda: auto -> fa4 for L=0 (1 layer; rule at L=0), triton for L=2..6 (3 layers; "
                         f"{IN_PLACE_REASON}), depth attached")   # the model's auto: in place where there is depth
    text = bm.impl_detail(Decoder(spec4.config(), ("moda",), moda_impl="fused"), "moda", spec4)
    assert text.endswith("; moda: fused -> fa4 for L=0 (1 layer; rule at L=0), fused for L=2..6 (3 layers; "
                         "rule at L=2), depth attached")
    model.moda_impl = "overlap"
    compiled = bm.impl_detail(model, "moda-detached", spec.replace(compile=True))
    assert compiled.endswith("; moda: triton (custom op, compiled; moda_impl overlap not applied), depth detached")


def test_the_moda_impl_option_reaches_every_spec(tmp_path, monkeypatch):
    import pandas as pd
    seen = []

    def fake_run(spec, csv, **kw):
        seen.append(spec.moda_impl)
        return pd.DataFrame([], columns=schema.MODEL_COLUMNS)
    monkeypatch.setattr(bm, "run_model", fake_run)
    base = ["model", "--out", str(tmp_path)]
    for extra, want in (([], ["auto"]), (["--moda-impl", "fused"], ["fused"]),
                        (["--preset", "seed002-train", "--moda-impl", "overlap"], ["overlap", "overlap"]),
                        (["--preset", "seed002-train"], ["auto", "auto"])):
        seen.clear()
        res = CliRunner().invoke(app, base + extra)
        assert res.exit_code == 0, res.output
        assert seen == want, extra
    with pytest.raises(ValueError, match="moda_impl must be auto or one of"):
        bm.ModelSpec("smoke", moda_impl="cute")


def test_a_backward_goes_to_the_op_that_made_its_node_not_a_detached_read_before_it():
    """A no-node op (a detached slice) under 'depth-kv' records the sequence number the next node
    takes; the heavy op under 'attention' makes that node, and its backward is attention's
    (the H100 profile of detached MoDA had given it to depth-kv)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from moda_bench.bench.model_profile import breakdown
    from moda_bench.models.decoder import label
    x = torch.randn(640, 640, requires_grad=True)
    buf = torch.randn(4, 640, 640)

    def step():
        with label("depth-kv"):
            side = buf.detach()[:2]            # no node: records the next node's number
        with label("attention"):
            y = torch.matmul(x, x) @ x          # the nodes, and the backward's work
        (y.sum() + side.sum()).backward()

    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    cats = breakdown(prof.events(), on_cuda=False)
    assert cats["attention"] > 4 * cats["depth-kv"]


def test_model_cli_runs_the_health_canary_and_marks_its_rows(tmp_path, monkeypatch):
    """The canary's start verdict goes into every row's `health`; a bad end check re-marks the rows
    and --strict exits 3 (the canary itself stubbed: no GPU here)."""
    import pandas as pd

    from moda_bench import health
    from moda_bench.cli import checks
    verdicts = iter([health.Verdict("healthy", "ok"), health.Verdict("shared", "another process on the GPU")] * 2)
    monkeypatch.setattr(health, "check_health", lambda i: next(verdicts))
    made = []

    class Enabled(checks.RunHealth):   # on this CPU machine the command would switch the canary off
        def __init__(self, devices, enabled=True):
            super().__init__(devices, enabled=True)
            made.append(self)

    monkeypatch.setattr(checks, "RunHealth", Enabled)
    args = ["model", "--model", "smoke", "--layers", "2", "--seq-len", "8", "--variants", "vanilla",
            "--quick", "--max-time-s", "1", "--out", str(tmp_path)]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0 and len(made) == 1, (done.exit_code, repr(done.exception), done.output[-300:])
    csv = next(tmp_path.glob("model_*.csv"))
    rows = pd.read_csv(csv)
    assert list(rows["health"]) == ["shared: another process on the GPU"]   # healthy at the start, shared at the end
    before = csv.read_text()
    strict = CliRunner().invoke(app, args + ["--strict"])
    assert strict.exit_code == checks.STRICT_EXIT, (strict.exit_code, strict.output[-300:])
    assert csv.read_text().startswith(before)   # re-marking the new row rewrites the earlier one as it was


def test_model_cli_depth_knobs_name_the_run_and_say_what_ran(tmp_path):
    import pandas as pd
    args = ["model", "--model", "smoke", "--layers", "2", "--seq-len", "8", "--variants", "vanilla,moda",
            "--quick", "--max-time-s", "1", "--out", str(tmp_path), "--depth-read", "copy", "--depth-grad-add", "after"]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    rows = pd.read_csv(tmp_path / "model_smoke-train-depth-copy-grad-after.csv")
    detail = rows.set_index("provider").loc["moda", "impl_detail"]
    assert "depth slices copied first" in detail and "depth gradients added after it" in detail
    bad = CliRunner().invoke(app, args[:-1] + ["later"])
    assert bad.exit_code == 2 and "depth_grad_add must be one of" in bad.output and "Traceback" not in bad.output


def test_model_cli_writes_the_folders_run_json(tmp_path, monkeypatch):
    """run.json holds every command that wrote the folder (once each) and each run's fields by label,
    as the results index reads it; keys another tool added stay."""
    import json
    import sys

    from moda_bench.reports.index import commands_of, read_run_json
    base = ["model", "--model", "smoke", "--layers", "2", "--seq-len", "8", "--quick", "--max-time-s", "1",
            "--out", str(tmp_path)]

    def run(*extra):
        args = base + list(extra)
        monkeypatch.setattr(sys, "argv", ["moda-bench", *args])   # what command_line() reads
        done = CliRunner().invoke(app, args)
        assert done.exit_code == 0, done.output

    run("--variants", "vanilla")
    record = json.loads((tmp_path / "run.json").read_text())
    record["question"] = "added by hand"
    (tmp_path / "run.json").write_text(json.dumps(record))
    run("--variants", "vanilla,mhc", "--batch", "2")
    run("--variants", "vanilla,mhc", "--batch", "2")
    meta = read_run_json(tmp_path)
    commands = commands_of(meta)
    assert len(commands) == 2 and all(c.startswith("moda-bench model --model smoke") for c in commands)
    assert "--batch 2" in commands[1] and meta["question"] == "added by hand"
    assert meta["runs"]["smoke-train"]["variants"] == ["vanilla", "mhc"] and meta["runs"]["smoke-train"]["batch"] == 2


def test_the_profile_keeps_moda_ffn_kv_apart_from_the_depth_buffer(tmp_path):
    """MoDA's FFN K/V projection (seed 000's, `ffn-kv`) and the depth buffer's handling (`depth-kv`)
    are separate categories, and vanilla has neither."""
    spec = bm.ModelSpec("smoke", ("vanilla", "moda"), layers=2, seq_len=8, batch=1)
    hook = profile_hook(spec, tmp_path / f"profile_{spec.label}.csv")
    bm.run_model(spec, tmp_path / f"model_{spec.label}.csv", device="cpu", progress=False, timer=one_sample,
                 on_model=hook)
    prof = results.read_profiles([tmp_path])
    moda, vanilla = (prof[prof["provider"] == p].set_index("category")["ms"] for p in ("moda", "vanilla"))
    assert moda["ffn-kv"] > 0 and moda["depth-kv"] > 0 and moda["attention"] > 0
    assert vanilla["ffn-kv"] == vanilla["depth-kv"] == 0


def test_a_profile_rerun_appended_to_its_file_replaces_the_earlier_run(runs, tmp_path):
    """Two profiled steps of one variant in one file: the reader keeps the newer run's rows only
    (the figure sums a variant's rows by category, so both would double its bar)."""
    import pandas as pd
    out, *_ = runs
    src = next(out.glob("profile_*.csv"))
    first = pd.read_csv(src)
    again = first.assign(ms=first["ms"] * 2, timestamp="2099-01-01T00:00:00+00:00")
    path = tmp_path / src.name
    pd.concat([first, again]).to_csv(path, index=False)
    got = results.read_profiles([path])
    assert len(got) == len(first) and set(got["timestamp"]) == {"2099-01-01T00:00:00+00:00"}
    assert got["ms"].sum() == pytest.approx(2 * first["ms"].sum())
