#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r4/$G; D=$R/kv-chunk-s17; mkdir -p $D
for spec in "1024:8:64:chunk=0;chunk=-1" "1024:8:0:chunk=0;chunk=-1" "2048:8:64:chunk=0;chunk=-1"; do
  IFS=: read T GG L V <<< "$spec"
  echo "== T=$T G=$GG L=$L"
  timeout 150 python3 tools/host_probe.py --T $T --G $GG --L $L --variants "$V" --max-time 4 > $D/ab4_T${T}_G${GG}_L${L}.log 2>&1
  grep -E "host|graph|eager|Error" $D/ab4_T${T}_G${GG}_L${L}.log | tail -12
done
cd /tmp/r4 && tar -czf $OUT/r4.tgz .
