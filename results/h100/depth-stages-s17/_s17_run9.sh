#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=/tmp/r9/h100; D=$R/depth-stages-s17; mkdir -p $D
python3 -c "
from moda_bench.ops.moda.config import resolve_config
from moda_bench.ops.moda.validate import MoDAShape
import torch
for T in (1024, 2048):
    c = resolve_config(MoDAShape(B=1, T=T, Hq=64, Hk=8, d=64, L=64), torch.bfloat16)
    print(T, c.fwd_depth, c.block_m, c.block_n, c.block_l, c.depth_stages, c.num_stages, '| bwd', c.bwd_depth, c.bwd_block_l, c.bwd_depth_stages)
" | tee $D/configs.log
for spec in "1024:8:64:bwd_depth_stages=3;bwd_depth_stages=4;bwd_block_l=64;bwd_block_l=16;bwd_block_l=64,bwd_depth_stages=3;depth_stages=3;depth_stages=1" \
            "2048:8:64:bwd_depth_stages=3;bwd_block_l=64;bwd_block_l=16;depth_stages=3"; do
  IFS=: read T GG L V <<< "$spec"
  echo "== T=$T G=$GG L=$L"
  timeout 200 python3 tools/host_probe.py --T $T --G $GG --L $L --variants "$V" --max-time 2 > $D/ab9_T${T}_G${GG}_L${L}.log 2>&1
  grep -E "graph|Error|failed" $D/ab9_T${T}_G${GG}_L${L}.log | tail -12
done
cd /tmp/r9 && tar -czf $OUT/r9.tgz .
