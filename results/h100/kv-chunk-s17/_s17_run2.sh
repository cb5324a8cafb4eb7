#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r2/$G; D=$R/kv-chunk-s17; mkdir -p $D
timeout 150 python3 tools/host_probe.py --T 1024 --phases --calls 500 > $D/phases_T1024.log 2>&1; grep -v Warn $D/phases_T1024.log
timeout 100 python3 tools/host_probe.py --T 1024 --cpu-trace > $D/cputrace_T1024.log 2>&1; head -40 $D/cputrace_T1024.log
for spec in "1024:8:64:beside=0;beside=0,chunk=0;chunk=0;chunk=8;beside=0,chunk=8" "1024:1:64:chunk=0;chunk=8;beside=0" \
            "1024:8:256:chunk=0;chunk=8;beside=0" "2048:8:64:chunk=0;chunk=8;beside=1"; do
  IFS=: read T GG L V <<< "$spec"
  echo "== T=$T G=$GG L=$L"
  timeout 150 python3 tools/host_probe.py --T $T --G $GG --L $L --variants "$V" --max-time 3 > $D/ab2_T${T}_G${GG}_L${L}.log 2>&1
  grep -E "graph|eager|Error" $D/ab2_T${T}_G${GG}_L${L}.log | tail -12
done
cd /tmp/r2 && tar -czf $OUT/r2.tgz .
