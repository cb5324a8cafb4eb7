#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=/tmp/r10/h100; D=$R/depth-stages-s17; mkdir -p $D
for spec in "4096:8:64" "8192:8:64" "16384:8:64" "16384:8:256" "16384:2:64" "4096:2:64" "16384:16:64" "1024:8:256" "1024:1:64"; do
  IFS=: read T GG L <<< "$spec"
  echo "== T=$T G=$GG L=$L"
  timeout 200 python3 tools/host_probe.py --T $T --G $GG --L $L --variants "bwd_depth_stages=3" --max-time 2 > $D/ab10_T${T}_G${GG}_L${L}.log 2>&1
  grep -E "graph|Error|failed" $D/ab10_T${T}_G${GG}_L${L}.log | tail -3
done
cd /tmp/r10 && tar -czf $OUT/r10.tgz .
