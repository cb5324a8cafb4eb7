"""`moda-bench report` over the new schema (no GPU, no torch): several GPUs kept apart, the floor
columns (issue 20) in the efficiency tables and the floor figure, the decode tables and figure,
the Depth-Attention tables and figure, the new configuration columns in captions, and older
CSVs without the new columns beside newer ones.

The CSVs are written here through the schema (`schema.COLUMNS`), their floor columns computed by
`moda_bench.floor` at made-up canary rates per GPU, so every number checked is one a real run
would write for those medians.
"""
from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import markdown_table

from moda_bench import floor, schema
from moda_bench.reports.inputs import load_results
from moda_bench.reports.report import generate_report

REPO = Path(__file__).resolve().parents[1]
H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
RATES = {H100: floor.Rates(700.0, 2900.0, "canary"), H200: floor.Rates(720.0, 4100.0, "canary")}
SPEED = {H100: 1.0, H200: 0.8}                    # H200 rows: 0.8x the H100 time
KIND = {"moda": "moda", "moda-fa4": "moda", "fa2": "sequence", "fa4": "sequence", "cudnn": "sequence",
        "dattn": "dattn", "dattn-torch": "dattn", "dattn-mix": "mix"}
DECODE_KIND = {"moda": "decode", "moda-nosplit": "decode", "fa2": "decode-sequence", "cudnn": "decode-sequence",
               "fa4": "decode-sequence", "flashinfer": "decode-sequence"}
FLOOR_COLUMNS = ["flops", "bytes", "floor_ms", "of_floor", "gbps"]


def base_row(gpu: str, sweep: str, provider: str, pass_: str, timer: str, **cfg) -> dict:
    row = dict.fromkeys(schema.COLUMNS, "")
    row.update(sweep=sweep, provider=provider, impl_detail="", G=cfg["Hq"] // cfg["Hk"], B=1, d=64, C=64,
               dtype="bfloat16", depth_grad=1, Tq=0, S=0, status="ok", timer=timer, gpu=gpu, gpu_index=0,
               torch_version="2.11.0", triton_version="3.6.0", git_commit="c0ffee", stop_reason="ci",
               timestamp="2026-03-01T00:00:00+00:00", samples=40, noise_pct=1.0, **{"pass": pass_})
    row.update(cfg)
    return row


def with_floor(row: dict, kind: str, ms: float) -> dict:
    """row + median_ms and the floor columns of `kind` at its GPU's rates."""
    work = floor.row_work(kind, row["pass"], B=row["B"], T=row["T"], Hq=row["Hq"], Hk=row["Hk"], d=row["d"],
                          L=row["L"], S=row["S"], Tq=row["Tq"], depth_grad=bool(row["depth_grad"]))
    row.update(median_ms=round(ms, 6), p20_ms=round(ms * 0.99, 6), p80_ms=round(ms * 1.01, 6))
    row.update(floor.floor_columns(work, RATES[row["gpu"]], row["median_ms"]))
    row["tflops"] = work.flops / (row["median_ms"] * 1e9)
    return row


def with_best(rows: list[dict], candidates) -> None:
    """ratio_to_best (+ a +-1% interval) and best_provider of one point's ok rows."""
    ok = [r for r in rows if r["status"] == "ok"]
    best = min((r for r in ok if r["provider"] in candidates), key=lambda r: r["median_ms"])
    for r in ok:
        ratio = r["median_ms"] / best["median_ms"]
        half = 0.0 if r is best else 0.01
        r.update(best_provider=best["provider"], ratio_to_best=round(ratio, 6),
                 ratio_to_best_lo=round(ratio - half, 6), ratio_to_best_hi=round(ratio + half, 6))


def training_rows(gpu: str, sweep: str = "T", depth_grad: int = 1) -> list[dict]:
    """A fwd+bwd T sweep (T = 4096, 8192) of moda, moda-fa4, fa2, fa4, cudnn with floor columns."""
    factor = {"fa2": 1.0, "fa4": 0.55, "cudnn": 0.66, "moda": 1.05, "moda-fa4": 0.62}
    out = []
    for T in (4096, 8192):
        point = []
        for p, f in factor.items():
            row = base_row(gpu, sweep, p, "fwdbwd", "eager", T=T, Hq=64, Hk=8, L=64, depth_grad=depth_grad)
            point.append(with_floor(row, KIND[p], 2.0 * (T / 4096) ** 2 * f * SPEED[gpu]))
        fa2 = next(r for r in point if r["provider"] == "fa2")
        for r in point:
            r["ratio_to_fa2"] = round(r["median_ms"] / fa2["median_ms"], 6)
            r["extra_time_pct"] = round((r["ratio_to_fa2"] - 1) * 100, 6)
        with_best(point, ("fa2", "fa4", "cudnn"))
        out += point
    return out


def decode_rows(gpu: str) -> list[dict]:
    """Sweeps decode-T2048 and decode-T8192 over B = 1, 8, 32, graph and eager timers; flashinfer
    is skipped at T=8192, B=32. Memory-bound medians: bytes at a share of the copy rate."""
    share = {"moda": 0.62, "moda-nosplit": 0.35, "fa2": 0.55, "cudnn": 0.5, "fa4": 0.6, "flashinfer": 0.58}
    out = []
    for T in (2048, 8192):
        for B in (1, 8, 32):
            for timer in ("graph", "eager"):
                point = []
                for p, s in share.items():
                    row = base_row(gpu, f"decode-T{T}", p, "decode", timer, T=T, Hq=64, Hk=8, L=64, B=B, Tq=1)
                    if p == "flashinfer" and T == 8192 and B == 32:
                        row.update(status="skipped", reason="flashinfer not installed")
                        point.append(row)
                        continue
                    L = 64 if DECODE_KIND[p] == "decode" else 0
                    nbytes = floor.decode_work(B, T, 1, 64, 8, 64, L).bytes
                    ms = nbytes / (RATES[gpu].copy_gbps * s * (1 + 0.02 * B) * 1e6) + (0.02 if timer == "eager" else 0)
                    point.append(with_floor(row, DECODE_KIND[p], ms))
                with_best(point, ("fa2", "cudnn", "fa4", "flashinfer"))
                out += point
    return out


def dattn_rows(gpu: str) -> list[dict]:
    """Sweeps dattn-1.5B-T4096 (Hk=6) and dattn-3B-T4096 (Hk=8), G=4, over S = 1, 4, 16 (L = S)."""
    out = []
    for model, hk in (("1.5B", 6), ("3B", 8)):
        for S in (1, 4, 16):
            base = 1.0 * hk / 8
            ms = {"fa4": base, "fa2": 1.8 * base, "moda": base * (1.3 + 0.02 * S), "moda-fa4": base * (1.1 + 0.01 * S),
                  "dattn": base * (1.05 + 0.01 * S), "dattn-torch": base * (1.5 + 0.05 * S)}
            point = []
            for p in ("dattn", "dattn-torch", "dattn-mix", "fa2", "fa4", "moda", "moda-fa4"):
                row = base_row(gpu, f"dattn-{model}-T4096", p, "fwdbwd", "eager", T=4096, Hq=4 * hk, Hk=hk, L=S, S=S)
                if p == "dattn-mix":
                    nbytes = floor.mix_work("fwdbwd", 1, 4096, 4 * hk, hk, 64, S).bytes
                    point.append(with_floor(row, "mix", nbytes / (RATES[gpu].copy_gbps * 0.7 * 1e6)))
                else:
                    point.append(with_floor(row, KIND[p], ms[p]))
            with_best(point, ("fa2", "fa4"))
            out += point
    return out


def write_csv(path: Path, rows: list[dict], columns=None) -> None:
    columns = columns or schema.COLUMNS
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


OLD_COLUMNS = [c for c in schema.COLUMNS if c not in FLOOR_COLUMNS + list(schema.CONFIG_DEFAULTS)]


def write_results(root: Path) -> dict:
    """root/h100/run: T sweep on the H100; root/h200/run: the same keys on the H200, a detached
    T sweep, decode and Depth-Attention sweeps; root/h200/old: a G sweep in the old layout (no
    floor or new configuration columns). Returns the rows per name."""
    rows = {"h100": training_rows(H100), "h200": training_rows(H200), "detached": training_rows(H200, "T-detached", 0),
            "decode": decode_rows(H200), "dattn": dattn_rows(H200)}
    old = [r for r in training_rows(H200, "G") if r["T"] == 4096]
    rows["old"] = old
    write_csv(root / "h100" / "run" / "sweep_T.csv", rows["h100"])
    write_csv(root / "h200" / "run" / "sweep_T.csv", rows["h200"] + rows["detached"])
    write_csv(root / "h200" / "decode" / "sweep_decode.csv", rows["decode"])
    write_csv(root / "h200" / "dattn" / "sweep_dattn.csv", rows["dattn"])
    write_csv(root / "h200" / "old" / "sweep_G.csv", old, OLD_COLUMNS)
    return rows


@pytest.fixture(scope="module")
def rep(tmp_path_factory):
    root = tmp_path_factory.mktemp("newschema")
    rows = write_results(root / "results")
    out = root / "out"
    written = generate_report([root / "results"], out, warn=lambda m: None)
    return root, rows, out, written, (out / "REPORT.md").read_text()


def table(md: str, heading: str) -> tuple[list[str], list[list[str]]]:
    """Header and body of the table after the one heading line equal to `heading`; a section split
    into several tables (its configuration columns repeated in each) is joined back into one."""
    lines = md.splitlines()
    matches = [i for i, line in enumerate(lines) if line == heading]
    assert len(matches) == 1, (heading, [line for line in lines if line.startswith("###")])
    return markdown_table(lines[matches[0] + 1:])


def at(header, body, column: str, **where) -> str:
    row = next(r for r in body if all(r[header.index(k)] == str(v) for k, v in where.items()))
    return row[header.index(column)]


def find(rows, provider, **cfg) -> dict:
    return next(r for r in rows if r["provider"] == provider and all(r[k] == v for k, v in cfg.items()))


EFF_T = "### Sweep over T (fwd+bwd; G=8, Hq=64, Hk=8, L=64, B=1, d=64, C=64, dtype=bfloat16) on "


def test_two_gpus_same_keys_kept_apart(rep):
    _, rows, out, written, md = rep
    assert f"GPUs: {H100}, {H200}; each GPU's rows are kept apart" in md
    h_a, b_a = table(md, EFF_T + H100)
    h_b, b_b = table(md, EFF_T + H200)
    for gpu_rows, (h, b) in ((rows["h100"], (h_a, b_a)), (rows["h200"], (h_b, b_b))):
        assert [r[0] for r in b] == ["4096", "8192"]             # one line per point: no cross-GPU duplicates
        for T in (4096, 8192):
            assert at(h, b, "MoDA ms", T=T) == f"{find(gpu_rows, 'moda', T=T)['median_ms']:.3f}"
            assert at(h, b, "FA2 ms", T=T) == f"{find(gpu_rows, 'fa2', T=T)['median_ms']:.3f}"
    assert at(h_a, b_a, "MoDA ms", T=4096) != at(h_b, b_b, "MoDA ms", T=4096)
    # the two GPUs' tables of one sweep follow each other
    headings = [line for line in md.splitlines() if line.startswith("### ")]
    assert headings[headings.index(EFF_T + H100) + 1] == EFF_T + H200
    names = {p.name for p in written if p.suffix == ".png"}
    for fig in ("runtime", "tflops", "floor", "extra_time", "ratio_to_best"):
        assert {f"{fig}-h100-80gb-hbm3.png", f"{fig}-h200.png"} <= names, (fig, names)
    assert {"decode-h200.png", "depth_attention-h200.png"} <= names
    assert not any(n.startswith("decode-h100") or n.startswith("depth_attention-h100") for n in names)
    assert "![floor-h100-80gb-hbm3](figures/floor-h100-80gb-hbm3.png)" in md
    assert f"ceiling per GPU: {H100}: 784.0 TFLOP/s" in md
    # the runtime figure of each GPU draws only that GPU's rows
    from moda_bench.reports.figures import runtime_figure
    from moda_bench.reports.tables import TRAIN, of_gpu, rows_of
    shown = load_results([rep[0] / "results"], warn=lambda m: None).rows
    for gpu in (H100, H200):
        fig = runtime_figure(rows_of(of_gpu(shown, gpu), TRAIN))
        ax = fig.axes[0]
        moda = next(l for l in ax.get_lines() if l.get_label() == "moda")
        want = [find(rows[{H100: "h100", H200: "h200"}[gpu]], "moda", T=T)["median_ms"] for T in (4096, 8192)]
        assert list(moda.get_ydata()) == pytest.approx(want)


def test_floor_columns_in_efficiency_table(rep):
    _, rows, _, _, md = rep
    header, body = table(md, EFF_T + H200)
    for col in ("MoDA floor ms", "MoDA x floor", "FA2 x floor", "moda-fa4 x floor", "fa4 x floor", "cudnn x floor"):
        assert col in header, (col, header)
    assert "flex x floor" not in header                         # never measured: no floor column
    assert header.index("fa4 x floor") > header.index("fa4/FA2")
    for T in (4096, 8192):
        moda, fa4 = find(rows["h200"], "moda", T=T), find(rows["h200"], "fa4", T=T)
        assert at(header, body, "MoDA floor ms", T=T) == f"{moda['floor_ms']:.3f}"
        assert at(header, body, "MoDA x floor", T=T) == f"{moda['of_floor']:.2f}x"
        assert at(header, body, "fa4 x floor", T=T) == f"{fa4['of_floor']:.2f}x"
        assert moda["of_floor"] == pytest.approx(moda["median_ms"] / moda["floor_ms"])
    assert "`MoDA floor ms` is the time no implementation" in md
    # the old-layout G sweep: no floor columns, no crash
    header, body = table(md, "### Sweep over G (fwd+bwd; T=4096, Hq=64, Hk=8, L=64, B=1, d=64, C=64, "
                         "dtype=bfloat16) on " + H200)
    assert not any("floor" in h for h in header) and [r[0] for r in body] == ["8"]


def test_captions_name_new_columns_only_off_default(rep):
    *_, md = rep
    header, body = table(md, "### Sweep 'T-detached' (fwd+bwd; G=8, Hq=64, Hk=8, L=64, B=1, d=64, C=64, "
                         "dtype=bfloat16, depth detached) on " + H200)
    assert [r[0] for r in body] == ["4096", "8192"] and "depth_grad" not in header
    headings = [line for line in md.splitlines() if line.startswith("###")]
    assert not any("Tq=0" in h or "S=0" in h or "depth_grad" in h for h in headings), headings
    assert not any("S=" in h for h in headings if h.startswith("### Depth-Attention"))   # S is the table's lines


def test_decode_table(rep):
    _, rows, _, _, md = rep
    dec = rows["decode"]
    header, body = table(md, f"### Sweep 'decode-T8192' (decode; Hq=64, Hk=8, d=64, dtype=bfloat16) on {H200}")
    assert header[:5] == ["B", "T", "Tq", "L", "fastest"]
    assert [r[0] for r in body] == ["1", "8", "32"]
    provs = ["moda", "moda-nosplit", "fa2", "cudnn", "fa4", "flashinfer"]
    assert [h[:-len(" graph µs")] for h in header if h.endswith(" graph µs")] == provs
    for p in provs:
        assert header.index(f"{p} graph µs") + 1 == header.index(f"{p} eager µs")
        for col in (f"{p} GB/s", f"{p} % of copy", f"{p}/fastest"):
            assert col in header, col
    for B in (1, 8, 32):
        g = find(dec, "moda", T=8192, B=B, timer="graph")
        e = find(dec, "moda", T=8192, B=B, timer="eager")
        assert at(header, body, "moda graph µs", B=B) == f"{g['median_ms'] * 1e3:.1f}"
        assert at(header, body, "moda eager µs", B=B) == f"{e['median_ms'] * 1e3:.1f}"
        assert at(header, body, "moda GB/s", B=B) == f"{g['gbps']:.0f}"              # from the graph rows
        assert at(header, body, "moda % of copy", B=B) == f"{100 / g['of_floor']:.1f}%"
        assert at(header, body, "moda/fastest", B=B) == \
            f"{g['ratio_to_best']:.3f} [{g['ratio_to_best_lo']:.3f}-{g['ratio_to_best_hi']:.3f}]"
        assert at(header, body, "fastest", B=B) == g["best_provider"] == "fa4"
    # decode is memory-bound: the share of the copy rate is the made-up one (0.62 (1 + 0.02 B))
    assert at(header, body, "moda % of copy", B=1) == f"{100 * 0.62 * 1.02:.1f}%"
    g = find(dec, "moda", T=8192, B=8, timer="graph")
    assert g["gbps"] == pytest.approx(RATES[H200].copy_gbps * 0.62 * 1.16, rel=1e-4)
    assert at(header, body, "flashinfer graph µs", B=32) == "skipped"
    assert at(header, body, "flashinfer GB/s", B=32) == "-"
    assert "## Decode" in md and md.index("## Decode") < md.index("## Depth-Attention") < md.index("## Ceiling")
    # decode rows are in neither the efficiency nor the eager-vs-graph tables
    assert "### Sweep 'decode-T8192' (decode;" in md and "(decode, eager timer" not in md
    assert not re.search(r"^### decode", md, re.M)


def test_dattn_table(rep):
    _, rows, _, _, md = rep
    da = rows["dattn"]
    header, body = table(md, f"### Depth-Attention, T=4096, Hq=32, Hk=8 (fwd+bwd; B=1, d=64, C=64, dtype=bfloat16) on "
                         f"{H200}")
    assert header == ["S", "fastest", "fastest ms", "dattn/fastest", "dattn-torch/fastest", "moda/fastest",
                      "moda-fa4/fastest", "dattn-mix ms", "dattn-mix GB/s", "dattn-mix % of copy"]
    assert [r[0] for r in body] == ["1", "4", "16"]
    for S in (1, 4, 16):
        for m in ("dattn", "dattn-torch", "moda", "moda-fa4"):
            r = find(da, m, S=S, Hk=8)
            assert at(header, body, f"{m}/fastest", S=S) == \
                f"{r['ratio_to_best']:.3f} [{r['ratio_to_best_lo']:.3f}-{r['ratio_to_best_hi']:.3f}]"
        assert at(header, body, "dattn/fastest", S=S).startswith(f"{1.05 + 0.01 * S:.3f} [")   # over fa4
        mix = find(da, "dattn-mix", S=S, Hk=8)
        assert at(header, body, "dattn-mix GB/s", S=S) == f"{mix['gbps']:.0f}"
        assert at(header, body, "dattn-mix % of copy", S=S) == f"{100 / mix['of_floor']:.1f}%"
        assert at(header, body, "fastest", S=S) == "fa4"
        assert at(header, body, "fastest ms", S=S) == f"{find(da, 'fa4', S=S, Hk=8)['median_ms']:.3f}"
    assert at(header, body, "dattn-mix % of copy", S=4) == "70.0%"
    table(md, f"### Depth-Attention, T=4096, Hq=24, Hk=6 (fwd+bwd; B=1, d=64, C=64, dtype=bfloat16) on {H200}")
    # Depth-Attention sweeps have no efficiency table of their own
    assert "### Sweep 'dattn-" not in md


def test_floor_figure(rep):
    from moda_bench.reports.tables import DATTN, DECODE, TRAIN, of_gpu, rows_of
    from moda_bench.reports.workload_figures import floor_figure
    root, rows, *_ = rep
    shown = of_gpu(load_results([root / "results"], warn=lambda m: None).rows, H200)
    fig = floor_figure(rows_of(shown, TRAIN, DATTN, DECODE))
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    # the old G sweep has no of_floor: no panel; decode sweeps in natural order
    assert titles == ["vs T (fwd+bwd)", "T-detached (fwd+bwd)", "dattn-1.5B-T4096 (fwd+bwd)",
                      "dattn-3B-T4096 (fwd+bwd)", "decode-T2048 (decode, graph timer)",
                      "decode-T8192 (decode, graph timer)"]
    ax = fig.axes[0]
    moda = next(l for l in ax.get_lines() if l.get_label() == "moda")
    assert list(moda.get_xdata()) == [4096, 8192]
    assert list(moda.get_ydata()) == pytest.approx([find(rows["h200"], "moda", T=T)["of_floor"] for T in (4096, 8192)])
    dattn_ax = fig.axes[3]
    assert dattn_ax.get_xlabel() == "source layers S"
    labels = [l.get_label() for l in dattn_ax.get_lines() if not l.get_label().startswith("_")]
    assert labels[:2] == ["moda", "fa2"] and "dattn-mix" in labels    # one line per provider, not per L
    dec_ax = fig.axes[5]
    assert dec_ax.get_xlabel() == "batch B"
    moda = next(l for l in dec_ax.get_lines() if l.get_label() == "moda")      # graph rows only: one line each
    want = [find(rows["decode"], "moda", T=8192, B=B, timer="graph")["of_floor"] for B in (1, 8, 32)]
    assert list(moda.get_ydata()) == pytest.approx(want)


def test_decode_figure(rep):
    from moda_bench.reports.workload_figures import decode_figure
    root, rows, *_ = rep
    fig = decode_figure(load_results([root / "results"], warn=lambda m: None).rows)
    axs = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axs] == ["T=2048", "T=8192"]
    ax = axs[1]
    assert ax.get_xscale() == "log" and list(ax.get_xticks()) == [1, 8, 32]
    lines = {l.get_label(): l for l in ax.get_lines()}
    assert [k for k in lines if not k.startswith("copy")] == ["moda", "moda-nosplit", "fa2", "cudnn", "fa4",
                                                               "flashinfer"]
    want = [find(rows["decode"], "moda", T=8192, B=B, timer="graph")["gbps"] for B in (1, 8, 32)]
    assert list(lines["moda"].get_ydata()) == pytest.approx(want)
    assert list(lines["flashinfer"].get_xdata()) == [1, 8]                  # skipped at B=32: not drawn
    copy = next(k for k in lines if k.startswith("copy rate"))
    assert copy == f"copy rate {RATES[H200].copy_gbps:.0f} GB/s"
    assert "graph timer" in fig.get_suptitle() and H200 not in fig.get_suptitle()   # titles name a GPU via write_all


def test_depth_attention_figure(rep):
    from moda_bench.reports.workload_figures import depth_attention_figure
    root, rows, *_ = rep
    fig = depth_attention_figure(load_results([root / "results"], warn=lambda m: None).rows)
    axs = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axs] == ["T=4096, Hq=24, Hk=6", "T=4096, Hq=32, Hk=8"]
    ax = axs[1]
    assert ax.get_xlabel() == "source layers S"
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["moda", "moda-fa4", "dattn", "dattn-torch"]
    assert len(ax.containers) == 4                                         # error bars: the paired interval
    dattn = ax.containers[2]
    want = [find(rows["dattn"], "dattn", S=S, Hk=8)["ratio_to_best"] for S in (1, 4, 16)]
    assert list(dattn.lines[0].get_ydata()) == pytest.approx(want)
    seg = dattn.lines[2][0].get_segments()[0]
    r = find(rows["dattn"], "dattn", S=1, Hk=8)
    assert [y for _, y in seg] == pytest.approx([r["ratio_to_best_lo"], r["ratio_to_best_hi"]])


def test_deterministic_and_no_torch(rep, tmp_path):
    """Same inputs, byte-identical outputs, also from a fresh interpreter that imports no torch or triton."""
    root, _, out, written, _ = rep
    fresh = tmp_path / "fresh"
    code = ("import sys; from pathlib import Path; from moda_bench.reports.report import generate_report; "
            f"generate_report([Path({str(root / 'results')!r})], Path({str(fresh)!r}), warn=lambda m: None); "
            "bad = [m for m in ('torch', 'triton') if m in sys.modules]; assert not bad, bad")
    env = {**os.environ, "PYTHONHASHSEED": "777", "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=tmp_path)
    for p in written:
        assert (fresh / p.relative_to(out)).read_bytes() == p.read_bytes(), p.name
    assert b"Matplotlib v" not in (out / "figures" / "decode-h200.png").read_bytes()


def test_one_gpu_keeps_plain_names(tmp_path):
    """A report of one GPU: headings and figure files do not name it (as before several GPUs)."""
    res = tmp_path / "results"
    write_csv(res / "decode.csv", decode_rows(H200))
    write_csv(res / "old.csv", [r for r in training_rows(H200, "G")], OLD_COLUMNS)
    written = generate_report([res], tmp_path / "out", warn=lambda m: None)
    names = sorted(p.name for p in written if p.suffix == ".png")
    assert names == ["decode.png", "extra_time.png", "floor.png", "ratio_to_best.png", "runtime.png", "tflops.png"]
    md = (tmp_path / "out" / "REPORT.md").read_text()
    assert " on NVIDIA" not in md and "GPUs:" not in md
    table(md, "### Sweep 'decode-T2048' (decode; Hq=64, Hk=8, d=64, dtype=bfloat16)")
    header, _ = table(md, "### Sweep over G (fwd+bwd; Hq=64, Hk=8, L=64, B=1, d=64, C=64, dtype=bfloat16)")
    assert not any("floor" in h for h in header)                          # old layout: no floor columns


def test_dattn_tables_per_sweep(tmp_path):
    """A second sweep at the same points (an A/B run of dattn against dattn-composed) gets tables
    of its own, named by its sweep; the preset's table keeps one line per S (no cross product of
    the two runs' rows)."""
    from moda_bench.reports.workloads import dattn_sections
    preset = [r for r in dattn_rows(H200) if r["Hk"] == 8]
    ab = []
    for S in (1, 4):
        point = []
        for p, ms in (("dattn", 1.02 + 0.001 * S), ("dattn-composed", 1.03 + 0.001 * S), ("fa4", 1.0)):
            row = base_row(H200, "S", p, "fwdbwd", "eager", T=4096, Hq=32, Hk=8, L=S, S=S)
            row["timestamp"] = "2026-03-02T00:00:00+00:00"
            point.append(with_floor(row, "sequence" if p == "fa4" else "dattn", ms))
        with_best(point, ("fa4",))
        ab += point
    write_csv(tmp_path / "preset" / "sweep_dattn.csv", preset)
    write_csv(tmp_path / "ab" / "sweep_S.csv", ab)
    secs = dattn_sections(load_results([tmp_path], warn=lambda m: None).rows)
    assert [s.title for s in secs] == ["Depth-Attention, T=4096, Hq=32, Hk=8 (sweep 'S')",
                                       "Depth-Attention, T=4096, Hq=32, Hk=8 (sweep 'dattn-3B-T4096')"]
    ab_sec, preset_sec = secs
    assert list(ab_sec.frame["S"]) == [1, 4] and ab_sec.others == ["dattn", "dattn-composed"]
    assert list(ab_sec.frame["dattn-composed:best_r"]) == pytest.approx([1.031, 1.034])
    assert list(preset_sec.frame["S"]) == [1, 4, 16] and "dattn-composed" not in preset_sec.others


def test_tuning_decisions_table(tmp_path):
    """The tuner's summaries (a current one with intervals and tuned_fields, an older one
    without decision or interval, and a newer re-tune of one key) become one table per GPU:
    newest entry per cache key, the interval where measured, the decision derived for the old
    file, the changed fields of kept winners; the report imports neither torch nor triton."""
    from moda_bench.results import read_tuning
    new_cols = schema.TUNE_COLUMNS
    old_cols = [c for c in new_cols if c not in ("candidate_ms", "ratio_lo", "ratio_hi", "min_gain", "decision",
                                                 "tuned_fields")]

    def row(T, G, L, default_ms, tuned_ms, ts, **kw):
        r = dict.fromkeys(new_cols, "")
        r.update(T=T, G=G, Hq=8 * G, Hk=8, L=L, B=1, d=64, C=64, dtype="bfloat16", default_ms=default_ms,
                 tuned_ms=tuned_ms, status="ok", config='{"fwd_depth": "stream", "bwd_depth": "fused"}',
                 cache_key=f"{H100}|triton 3.6.0|bfloat16|d64|G{G}|L{L}|T<={T}", gpu=H100, timestamp=ts)
        r.update(kw)
        return r
    write_csv(tmp_path / "h100" / "tuning" / "tune_G.csv",
              [row(16384, 2, 64, 8.682, 8.255, "2026-11-23T22:35:07+00:00", candidate_ms=8.255, ratio=0.9546,
                   ratio_lo=0.9500, ratio_hi=0.9592, min_gain=0.03, decision="tuned",
                   tuned_fields="fwd_depth=stream bwd_depth=fused"),
               row(16384, 8, 256, 33.22, 33.22, "2026-11-23T22:36:00+00:00", candidate_ms=float("nan"),
                   min_gain=0.03, decision="default")], new_cols)
    write_csv(tmp_path / "h100" / "tuning" / "l256" / "tune_L.csv",
              [row(16384, 8, 256, 33.59, 33.59, "2026-11-23T22:44:00+00:00", candidate_ms=33.68, ratio=1.002,
                   ratio_lo=0.996, ratio_hi=1.008, min_gain=0.03, decision="default")], new_cols)
    write_csv(tmp_path / "h200" / "tuning" / "tune_T.csv",
              [{**row(4096, 8, 64, 2.236, 2.236, "2026-03-01T00:00:00+00:00", ratio=1.0), "gpu": H200,
                "cache_key": f"{H200}|k"},
               {**row(16384, 32, 64, 104.0, 103.1, "2026-03-01T00:00:00+00:00", ratio=0.991), "gpu": H200,
                "cache_key": f"moda-overlap|{H200}|k2"}], old_cols)
    tune = read_tuning([tmp_path], warn=lambda m: None)
    assert len(tune) == 4 and list(tune["decision"]) == ["tuned", "default", "default", "faster median"]
    assert tune.loc[tune["L"] == 256, "default_ms"].item() == pytest.approx(33.59)   # the newer re-tune
    roots = [tmp_path / "results"]
    write_csv(roots[0] / "h100" / "run" / "sweep_T.csv", training_rows(H100))
    (roots[0] / "tuning").mkdir()
    for f in tmp_path.glob("h*/tuning/**/*.csv"):
        (roots[0] / "tuning" / f"{f.parent.name}_{f.parent.parent.name}_{f.name}").write_text(f.read_text())
    out = tmp_path / "out"
    code = ("import sys; from pathlib import Path; from moda_bench.reports.report import generate_report; "
            f"generate_report([Path({str(roots[0])!r})], Path({str(out)!r}), figures=False, warn=lambda m: None); "
            "bad = [m for m in ('torch', 'triton') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    md = (out / "REPORT.md").read_text()
    assert "## Tuning decisions" in md
    header, body = table(md, f"### Tuning decisions on {H100}")
    assert header[:5] == ["T", "G", "L", "d", "dtype"] and len(body) == 2
    assert at(header, body, "candidate/default", G=2) == "0.955 [0.950-0.959]"
    assert at(header, body, "decision", G=2) == "tuned"
    assert at(header, body, "kept config (fields changed)", G=2) == "fwd_depth=stream bwd_depth=fused"
    assert at(header, body, "candidate/default", L=256) == "1.002 [0.996-1.008]"
    assert at(header, body, "op", G=2) == "moda" and at(header, body, "summary", G=2).endswith("tune_G.csv")
    header, body = table(md, f"### Tuning decisions on {H200}")
    assert at(header, body, "candidate/default", G=32) == "0.991"
    assert at(header, body, "decision", G=32) == "faster median" and at(header, body, "op", G=32) == "moda-overlap"
    assert at(header, body, "kept config (fields changed)", G=32).startswith("fwd_depth=stream bwd_depth=fused (")


def test_repeat_markdown_counts_and_names_rows_that_did_not_repeat():
    """The report's repeat-check line: nothing without the column or measured values, a count when
    every measured row repeated, a loud list of the rows whose forward gave two outputs."""
    import pandas as pd

    from moda_bench.reports.markdown import repeat_markdown
    base = dict(provider="moda-fa4", sweep="T", T=32768, G=8, L=64, **{"pass": "fwd"}, _file="h100/x/sweep_T.csv")
    assert repeat_markdown(pd.DataFrame([base])) == ""
    assert repeat_markdown(pd.DataFrame([dict(base, repeat_err=float("nan"))])) == ""
    ok = repeat_markdown(pd.DataFrame([dict(base, repeat_err=0.0), dict(base, repeat_err=float("nan"))]))
    assert "1 of 2 row(s)" in ok and "bitwise equal" in ok and "WARNING" not in ok
    bad = repeat_markdown(pd.DataFrame([dict(base, repeat_err=0.0), dict(base, repeat_err=0.0139)]))
    assert "WARNING: 1 of them" in bad and "`moda-fa4` T sweep, T=32768" in bad and "1.39e-02" in bad
