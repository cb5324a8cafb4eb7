"""The FA4 mask-route prototype (experiments/fa4_mask_route.py): its block lists cover the MoDA mask."""
import itertools

import pytest
import torch


def _mask_route_tool():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "fa4_mask_route.py"
    spec = importlib.util.spec_from_file_location("fa4_mask_route", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("T,L,block", [(1, 1, 4), (37, 5, 8), (70, 3, 16), (130, 16, 16)])
def test_mask_route_block_lists_cover_the_mask(T, L, block):
    """experiments/fa4_mask_route.py: its block lists hold every block with a kept (query, key) pair,
    "full" only where all pairs are kept, compared with the element mask block by block."""
    tool = _mask_route_tool()
    partial, full = tool.block_masks(T, L, "cpu", block)
    Tk = T + T * L
    qi, ki = torch.arange(T)[:, None], torch.arange(Tk)[None, :]
    keep = (ki <= qi) | ((ki >= T + qi * L) & (ki < T + (qi + 1) * L))
    assert int(keep.sum()) == T * (T + 1) // 2 + T * L
    for i, j in itertools.product(range(partial.shape[0]), range(partial.shape[1])):
        blk = keep[i * block:(i + 1) * block, j * block:(j + 1) * block]
        assert bool(partial[i, j] or full[i, j]) == bool(blk.any()), (i, j)
        assert not (partial[i, j] and full[i, j])
        if full[i, j]:
            assert bool(blk.all()), (i, j)
    cnt, idx = tool.block_listing(partial)
    for i in range(partial.shape[0]):
        assert idx[0, 0, i, :cnt[0, 0, i]].tolist() == partial[i].nonzero().flatten().tolist()


