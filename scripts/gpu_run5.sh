#!/usr/bin/env bash
# GPU call (issue 8): the depth-only kernels alone, bandwidth over a grid of tile shapes.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MODA_BENCH_NO_TUNING=1
mkdir -p $OUT/r
nvidia-smi --query-gpu=name --format=csv,noheader
python3 - <<'PY'
import torch
x = torch.empty(2**30, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
from triton.testing import do_bench
ms = do_bench(lambda: y.copy_(x))
print(f"copy bandwidth (1 GiB, read+write): {2 * 2**30 / ms / 1e9:.2f} TB/s")
PY
timeout 420 python3 scripts/depth_probe.py --T 8192 --shapes 8:64,2:64,8:256 --block-m 32,64,128 --block-l 32,64 \
  --warps 4,8 --stages 1,2 --out $OUT/r/depth_probe.csv > $OUT/r/depth_probe.log 2>&1
tail -32 $OUT/r/depth_probe.log
grep -c " ms " $OUT/r/depth_probe.log
tar czf $OUT/results.tgz -C $OUT/r . && ls $OUT
