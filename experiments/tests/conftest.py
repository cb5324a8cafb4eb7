"""Tests of the prototypes in experiments/ (not collected by the product's test command):

    TRITON_INTERPRET=1 python3 -m pytest -q experiments/tests

`load_tool(name)` imports experiments/<name>.py, with experiments/ and tests/ on sys.path for the
prototypes' own imports and the product tests' helpers."""
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXPERIMENTS = os.path.dirname(HERE)
for p in (EXPERIMENTS, os.path.join(os.path.dirname(EXPERIMENTS), "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)


def load_tool(name: str):
    """The module experiments/<name>.py."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXPERIMENTS, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
