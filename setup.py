"""Packaging beside pyproject.toml (which holds the metadata): the package list, with the
top-level `sweeps/` directory mapped into the package as `moda_bench.sweeps`, so the presets'
TOML files ship in the wheel (their package data is declared in pyproject.toml). A mapped
directory cannot be expressed with pyproject's `packages.find`, hence this file."""
from setuptools import find_namespace_packages, setup

setup(packages=find_namespace_packages(include=["moda_bench", "moda_bench.*"]) + ["moda_bench.sweeps"],
      package_dir={"moda_bench.sweeps": "sweeps"})
