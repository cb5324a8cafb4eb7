"""The floor plan stays true: imports point down the layers, no cycles, no private names.

Layers, bottom to top (a module may import its own layer and the ones below):
  0 core     moda_bench.schema, .timing, .results, .health, .floor, .host   (columns, numbers, one reader)
  1 kernels  moda_bench.kernels.*, .models.*   (operators: references, kernels, launches; whole decoders)
  2 tuning   moda_bench.tuning.*
  3 bench    moda_bench.bench.*                                (providers, runner, pools)
  4 reports  moda_bench.reports.*
  5 cli      moda_bench.cli, moda_bench (the package face)

Every import counts, also those inside functions. The walker is tested on a small synthetic
package too, so a broken walker cannot pass silently.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = "moda_bench"
ROOT = Path(__file__).resolve().parents[1]
LAYERS = [
    ("core", ["schema", "ratios", "timing", "results", "health", "floor", "host"]),
    ("kernels", ["kernels", "models"]),
    ("tuning", ["tuning"]),
    ("bench", ["bench"]),
    ("reports", ["reports"]),
    ("cli", ["cli", ""]),
]
MAX_LINES = 600


def module_name(path: Path, root: Path, pkg: str) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def layer_of(mod: str, pkg: str, layers=LAYERS) -> int:
    rest = mod[len(pkg) + 1:] if mod != pkg else ""
    head = rest.split(".")[0]
    for rank, (_, heads) in enumerate(layers):
        if head in heads:
            return rank
    raise AssertionError(f"{mod}: not in any layer; add it to LAYERS in tests/test_layers.py")


def scan(root: Path, pkg: str):
    """(modules, edges, private) of the package under root/pkg: edges are (importer, imported,
    line) for every import of a package module; private are (importer, name, line)."""
    files = sorted((root / pkg).rglob("*.py"))
    modules = {module_name(f, root, pkg): f for f in files}
    edges, private = [], []
    for mod, f in modules.items():
        is_pkg = f.name == "__init__.py"
        tree = ast.parse(f.read_text(), str(f))
        aliases = {}
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == pkg:
                        targets.append(a.name)
                        aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else pkg
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                if src.split(".")[0] != pkg:
                    continue
                for a in node.names:
                    sub = f"{src}.{a.name}"
                    if sub in modules:  # from pkg import submodule
                        targets.append(sub)
                        aliases[a.asname or a.name] = sub
                    else:
                        targets.append(src)
                        if a.name.startswith("_") and not a.name.startswith("__") and src != mod:
                            private.append((mod, f"{src}.{a.name}", node.lineno))
            elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.attr.startswith("_") and not node.attr.startswith("__")):
                target = aliases.get(node.value.id)
                if target and target != mod:
                    private.append((mod, f"{target}.{node.attr}", node.lineno))
            for t in targets:
                # an import of pkg.a.b names pkg.a.b if it is a module, else its nearest module parent
                while t not in modules and "." in t:
                    t = t.rsplit(".", 1)[0]
                if t in modules and t != mod:
                    edges.append((mod, t, node.lineno))
    return modules, edges, private


def violations(root: Path, pkg: str, layers=LAYERS) -> list[str]:
    modules, edges, private = scan(root, pkg)
    for m in modules:
        layer_of(m, pkg, layers)
    edges = sorted(set(edges))
    out = []
    for a, b, line in edges:
        if layer_of(b, pkg, layers) > layer_of(a, pkg, layers):
            out.append(f"upward import: {a} (line {line}) imports {b}")
    for a, name, line in private:
        out.append(f"private name: {a} (line {line}) uses {name}")
    graph = {m: set() for m in modules}
    for a, b, _ in edges:
        graph[a].add(b)
    state, stack = {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                out.append("import cycle: " + " -> ".join(stack[stack.index(n):] + [n]))
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(modules):
        if m not in state:
            visit(m)
    return out


def test_package_imports_point_down_without_cycles_or_private_names():
    problems = violations(ROOT, PKG)
    assert not problems, "\n".join(problems)


def test_every_module_is_short_and_says_what_it_owns():
    modules, _, _ = scan(ROOT, PKG)
    for mod, f in modules.items():
        text = f.read_text()
        assert len(text.splitlines()) <= MAX_LINES, f"{f} has {len(text.splitlines())} lines (> {MAX_LINES})"
        if text.strip():
            assert ast.get_docstring(ast.parse(text)), f"{f} has no module docstring"


def _write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


@pytest.fixture
def toy(tmp_path):
    """A clean toy package: cli -> bench -> kernels, core at the bottom."""
    _write(tmp_path, "toy/__init__.py", "")
    _write(tmp_path, "toy/schema.py", "X = 1\n")
    _write(tmp_path, "toy/kernels/__init__.py", "")
    _write(tmp_path, "toy/kernels/k.py", "from toy import schema\n")
    _write(tmp_path, "toy/bench/__init__.py", "")
    _write(tmp_path, "toy/bench/run.py", "from ..kernels import k\ndef f():\n    from toy.schema import X\n")
    _write(tmp_path, "toy/cli.py", "import toy.bench.run\n")
    return tmp_path


def test_walker_accepts_a_clean_package(toy):
    assert violations(toy, "toy") == []


def test_walker_finds_a_function_level_upward_import(toy):
    _write(toy, "toy/kernels/k.py", "from toy import schema\ndef g():\n    from toy.bench import run\n")
    problems = violations(toy, "toy")
    assert any(p.startswith("upward import: toy.kernels.k") for p in problems), problems
    assert any(p.startswith("import cycle") for p in problems), problems


def test_walker_finds_a_relative_upward_import_and_a_private_name(toy):
    _write(toy, "toy/kernels/k.py", "from ..bench.run import f\n")
    _write(toy, "toy/bench/run.py", "from toy.kernels import k\nfrom toy.schema import _hidden\ny = k._secret\n")
    problems = violations(toy, "toy")
    assert any("upward import: toy.kernels.k" in p for p in problems), problems
    assert any("private name: toy.bench.run (line 2) uses toy.schema._hidden" in p for p in problems), problems
    assert any("private name: toy.bench.run (line 3) uses toy.kernels.k._secret" in p for p in problems), problems


def test_walker_rejects_a_module_outside_the_layers(toy):
    _write(toy, "toy/stray.py", "")
    with pytest.raises(AssertionError, match="toy.stray: not in any layer"):
        violations(toy, "toy")


def test_no_import_cycle_among_the_scripts():
    """tools/ and experiments/ are folders of scripts that may import one another by module name
    (their folder on sys.path): no cycle among them either."""
    scripts = {f.stem: f for base in ("tools", "experiments") for f in (ROOT / base).glob("*.py")}
    edges = {name: set() for name in scripts}
    for name, f in scripts.items():
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            edges[name].update(n for n in names if n in scripts and n != name)
    done, path = set(), []

    def visit(u):
        if u in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(u):] + [u]))
        if u in done:
            return
        path.append(u)
        for v in sorted(edges[u]):
            visit(v)
        path.pop()
        done.add(u)

    for name in sorted(scripts):
        visit(name)
