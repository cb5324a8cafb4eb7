#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r7/$G; D=$R/kv-depth-items-s17; mkdir -p $D
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_moda_bwd_chunks.py tests/test_moda_bwd_tma.py -k "gpu or items" > $D/tests_gpu7.log 2>&1; tail -n 2 $D/tests_gpu7.log
timeout 100 python3 tools/host_probe.py --T 1024 --kernels --calls 100 > $D/kernels_T1024.log 2>&1; grep -E "us  x|in all|---" $D/kernels_T1024.log | head -6
for spec in "1024:8:64:items=0;items=0,chunk=0" "2048:8:64:items=0;items=0,chunk=0" "4096:8:64:items=1" \
            "1024:8:256:items=0" "1024:16:64:items=0" "1024:1:64:items=0" "2048:8:256:items=0" "2048:2:64:items=0"; do
  IFS=: read T GG L V <<< "$spec"
  echo "== T=$T G=$GG L=$L"
  timeout 150 python3 tools/host_probe.py --T $T --G $GG --L $L --variants "$V" --max-time 3 > $D/ab7_T${T}_G${GG}_L${L}.log 2>&1
  grep -E "graph|eager|Error|failed" $D/ab7_T${T}_G${GG}_L${L}.log | tail -12
done
cd /tmp/r7 && tar -czf $OUT/r7.tgz .
