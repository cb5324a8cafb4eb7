"""The sweep presets as data: every shipped `sweeps/*.toml` loads to the sweeps it was written
for, a user's own file runs through `--preset path.toml`, each mistake in a file is one line
naming the file and the key, `--list-presets` lists them, and the wheel ships them. CPU only."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from moda_bench import schema
from moda_bench.bench.presets import PresetError, SweepSpec, load_preset, read_preset, shipped_presets, sweeps_dir

ROOT = Path(__file__).resolve().parents[1]


def _expected() -> dict:
    """What each shipped preset holds: (sweeps, pass, providers, timers); the presets' definitions
    from before they became TOML files, spelled out (decode: issue 22; Depth-Attention: issue 23)."""
    heads = (("Tq", 1), ("G", 8), ("Hk", 8), ("d", 64), ("L", 64))
    decode = tuple(SweepSpec("B", None, f"decode-T{t}", (("T", t),) + heads) for t in (2048, 8192, 32768, 131072))
    dattn = tuple(SweepSpec("S", None, f"dattn-{m}-T{t}", (("T", t), ("G", 4), ("Hk", hk), ("d", 64)))
                  for m, hk in (("3B", 8), ("1.5B", 6)) for t in (16384, 8192, 4096, 2048))
    shapes = (("700m", (2, 8, 16, 24, 32, 46), 8, 2), ("1.5b", (2, 8, 16, 24, 34), 12, 4))
    models = tuple(SweepSpec("L", values, f"moda-{m}-T4096", (("T", 4096), ("G", 2), ("Hk", hk), ("d", 64), ("B", b)))
                   for m, values, hk, b in shapes)
    return {
        "paper": ((SweepSpec("T"), SweepSpec("G"), SweepSpec("L")), None, None, ()),
        "smoke": ((SweepSpec("T", (1024, 4096)),), None, None, ()),
        "decode": (decode, "decode", "moda,moda-nosplit,fa2,cudnn,fa4,flashinfer", ()),
        "depth-attention": (dattn, None, "dattn,dattn-torch,dattn-mix,fa4,fa2,moda,moda-fa4", ("graph", "eager")),
        "moda-models": (models, None, "moda-triton,moda-fa4,moda-overlap,moda-fused,fa4", ()),
    }


def test_every_shipped_preset_loads_to_its_definition():
    expected = _expected()
    shipped = shipped_presets()
    assert sweeps_dir() == ROOT / "sweeps" and set(shipped) == set(expected)
    for name, (sweeps, pass_, providers, timers) in expected.items():
        p = load_preset(name)
        assert (p.name, p.path, p.sweeps, p.pass_, p.providers, p.timers) == \
            (name, shipped[name], sweeps, pass_, providers, timers), name
        assert p.description and "\n" not in p.description
        assert all(s.vary in schema.AXES for s in p.sweeps)


def _write(tmp_path, text: str, name: str = "mine.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_user_file_is_read_like_a_shipped_one(tmp_path):
    path = _write(tmp_path, 'description = "mine"\npass = "fwd"\nproviders = "moda, fa2"\n'
                            '[[sweep]]\nvary = "G"\nvalues = [2, 6]\nname = "g"\nbase = { T = 3000, L = 0 }\n'
                            '[[sweep]]\nvary = "T"\n')
    p = load_preset(str(path))
    assert p.name == "mine" and p.pass_ == "fwd" and p.providers == "moda,fa2" and p.timers == ()
    assert p.sweeps == (SweepSpec("G", (2, 6), "g", (("T", 3000), ("L", 0))), SweepSpec("T"))
    assert p.select("g") == p.sweeps[:1]


@pytest.mark.parametrize("text,key", [
    ('description = "x"\n[[sweep]]\nvary = "Q"\n', "sweep[0].vary"),
    ('colour = "red"\n[[sweep]]\nvary = "T"\n', "colour"),
    ('[[sweep]]\nvary = "T"\nvalue = [1]\n', "sweep[0].value"),
    ('[[sweep]]\nvary = "T"\n[[sweep]]\nvary = "G"\nvalues = [2, 0]\n', "sweep[1].values"),
    ('[[sweep]]\nvary = "T"\nvalues = [5, 5]\n', "sweep[0].values"),
    ('[[sweep]]\nvary = "T"\nbase = { Z = 1 }\n', "sweep[0].base.Z"),
    ('[[sweep]]\nvary = "T"\nbase = { G = "8" }\n', "sweep[0].base.G"),
    ('pass = "both"\n[[sweep]]\nvary = "T"\n', "pass"),
    ('timers = ["wall"]\n[[sweep]]\nvary = "T"\n', "timers"),
    ('providers = [1]\n[[sweep]]\nvary = "T"\n', "providers"),
    ('description = "no sweeps"\n', "sweep"),
    ('[[sweep]]\nvary = "T"\n[[sweep]]\nvary = "T"\nvalues = [64]\n', "sweep"),
    ('[[sweep]]\nvary = "Tq"\n', "sweep"),
])
def test_a_mistake_is_one_line_naming_the_file_and_key(tmp_path, text, key):
    path = _write(tmp_path, text)
    with pytest.raises(PresetError) as err:
        read_preset(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: {key}: ") and "\n" not in msg


def test_unknown_names_missing_files_and_bad_toml(tmp_path):
    known = "known: decode, depth-attention, moda-models, paper, smoke"
    with pytest.raises(PresetError, match=f"unknown preset 'nope'; {known}"):
        load_preset("nope")
    with pytest.raises(PresetError, match="no such preset file"):
        load_preset(str(tmp_path / "absent.toml"))
    bad = _write(tmp_path, "[[sweep]\nvary = 'T'\n")
    with pytest.raises(PresetError, match=re.escape(f"{bad}: not valid TOML: ")):
        load_preset(str(bad))


def _app():
    from moda_bench.cli.sweep import sweep_command
    app = typer.Typer()
    app.command()(sweep_command)
    return app


def test_list_presets_names_each_file_and_description():
    res = CliRunner().invoke(_app(), ["--list-presets"], env={"COLUMNS": "300"})
    assert res.exit_code == 0, res.output
    for name, path in shipped_presets().items():
        line = next(x for x in res.output.splitlines() if f" {name} " in x)
        assert str(path) in line and load_preset(name).description in line


def test_the_sweep_command_runs_a_user_file(tmp_path, monkeypatch):
    """--preset path.toml: its sweeps, pass, providers and base reach the runner (stubbed); a bad
    file stops with one line and no traceback."""
    import torch

    from moda_bench import floor
    from moda_bench.bench import runner
    from moda_bench.cli import checks
    seen = []
    monkeypatch.setattr(runner, "run_sweep", lambda points, spec, csv_path, **kw: seen.append((kw["sweep_name"],
                                                                                                points, spec)))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(checks.RunHealth, "rates", lambda self: floor.Rates())
    path = _write(tmp_path, 'pass = "fwd"\nproviders = ["fa2"]\n[[sweep]]\nname = "odd"\nvary = "T"\n'
                            'values = [96, 160]\nbase = { G = 3, L = 5 }\n')
    res = CliRunner().invoke(_app(), ["--preset", str(path), "--no-health-check", "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    (name, points, spec), = seen
    assert name == "odd" and [(p.T, p.G, p.L) for p in points] == [(96, 3, 5), (160, 3, 5)]
    assert spec.pass_ == "fwd" and spec.providers == ("fa2",)
    bad = _write(tmp_path, '[[sweep]]\nvary = "T"\nvalues = "1024"\n', "bad.toml")
    res = CliRunner().invoke(_app(), ["--preset", str(bad)])
    assert res.exit_code == 2 and "sweep[0].values" in res.output and "Traceback" not in res.output


def test_the_wheel_ships_every_preset(tmp_path):
    """Build the wheel from a copy of the sources (the checkout stays clean) and install it into a
    target folder: it holds every sweeps/*.toml, and the installed package finds them by name."""
    import importlib.util

    import setuptools
    if tuple(int(x) for x in setuptools.__version__.split(".")[:2]) < (70, 1) and not importlib.util.find_spec("wheel"):
        pytest.skip(f"building a wheel without isolation needs setuptools >= 70.1 or the wheel package "
                    f"(setuptools {setuptools.__version__} here)")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "moda_bench", src / "moda_bench", ignore=ignore)
    shutil.copytree(ROOT / "sweeps", src / "sweeps", ignore=ignore)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)],
                   check=True, capture_output=True, cwd=tmp_path)
    wheel, = (tmp_path / "dist").glob("moda_bench-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"moda_bench/sweeps/{p.name}" for p in (ROOT / "sweeps").glob("*.toml")}
    assert shipped and shipped <= names and "moda_bench/sweeps/README.md" in names
    assert "moda_bench/kernels/moda/tuned/README.md" in names and "moda_bench/cli/sweep.py" in names
    subprocess.run(pip + ["install", "--no-deps", "--no-compile", "--target", str(tmp_path / "site"), str(wheel)],
                   check=True, capture_output=True, cwd=tmp_path)
    code = ("from moda_bench.bench.presets import load_preset, shipped_presets, sweeps_dir\n"
            "print(sweeps_dir()); print(sorted(shipped_presets())); print(len(load_preset('decode').sweeps))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=tmp_path,
                         env={"PYTHONPATH": str(tmp_path / "site"), "PATH": ""}).stdout.splitlines()
    assert out == [str(tmp_path / "site" / "moda_bench" / "sweeps"), str(sorted(p.stem for p in
                   (ROOT / "sweeps").glob("*.toml"))), "4"]
