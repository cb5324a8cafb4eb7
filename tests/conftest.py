"""Test set-up: Triton kernels run on the CPU interpreter unless a GPU is present."""
import os

import pytest

try:
    import torch
    _HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    _HAS_CUDA = False

if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if _HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def isolated_tuning(monkeypatch, tmp_path):
    """No test sees the user's tuning cache or the package's shipped configs, or leaves a config
    source installed."""
    from moda_bench import tuning as tu
    from moda_bench.kernels.moda import config as config_mod
    monkeypatch.setenv(tu.ENV_CACHE, str(tmp_path / "env-cache.json"))
    monkeypatch.delenv(tu.ENV_NO_TUNING, raising=False)
    monkeypatch.setattr(config_mod, "SHIPPED_DIR", tmp_path / "no-shipped-configs")
    config_mod.reset_shipped()
    tu.stop_using()
    yield
    tu.stop_using()
    config_mod.reset_shipped()
