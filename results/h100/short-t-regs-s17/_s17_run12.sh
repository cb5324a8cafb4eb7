#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=/tmp/r12/h100; D=$R/short-t-regs-s17; mkdir -p $D
for spec in "1024:8:64" "2048:8:64" "1024:8:0" "2048:8:0"; do
  IFS=: read T GG L <<< "$spec"
  echo "== T=$T G=$GG L=$L"
  timeout 200 python3 tools/host_probe.py --T $T --G $GG --L $L --variants "bwd_q_maxnreg=168;bwd_kv_maxnreg=168;bwd_q_maxnreg=168,bwd_kv_maxnreg=168;bwd_q_maxnreg=168,bwd_depth_stages=2" --max-time 2 > $D/ab12_T${T}_G${GG}_L${L}.log 2>&1
  grep -E "graph|Error|failed" $D/ab12_T${T}_G${GG}_L${L}.log | tail -6
done
cd /tmp/r12 && tar -czf $OUT/r12.tgz .
