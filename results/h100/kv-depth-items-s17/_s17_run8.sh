#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=/tmp/r8/h100; D=$R/kv-depth-items-s17; mkdir -p $D
timeout 120 python3 tools/_s17_regs.py 1024 > $D/regs_T1024.log 2>&1; cat $D/regs_T1024.log | tail -8
timeout 100 python3 tools/host_probe.py --T 1024 --kernels --calls 100 > $D/kernels8_T1024.log 2>&1; grep -E "us  x|in all|---" $D/kernels8_T1024.log | head -5
for spec in "1024:8:64:items=1;items=0" "2048:8:64:items=1;items=0" "1024:8:256:items=1;items=0"; do
  IFS=: read T GG L V <<< "$spec"
  echo "== T=$T G=$GG L=$L"
  timeout 150 python3 tools/host_probe.py --T $T --G $GG --L $L --variants "$V" --max-time 3 > $D/ab8_T${T}_G${GG}_L${L}.log 2>&1
  grep -E "graph|Error|failed" $D/ab8_T${T}_G${GG}_L${L}.log | tail -12
done
cd /tmp/r8 && tar -czf $OUT/r8.tgz .
