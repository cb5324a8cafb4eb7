#!/bin/bash
# session 25, tenth call (ca2619b): the tuner on the rows the host-side descriptors changed (T = 1024,
# 2048, 4096, 8192): small tiles no longer pay a descriptor build a program
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
T=/tmp/r10/$G/tuning-s25; mkdir -p $T
TUNE="python3 -m moda_bench.cli tune --kernels fwd_depth,bwd_depth,fwd,bwd_q,bwd_kv --budget 6 --min-gain 3% --cache $T/tuning.json"
for t in 1024 2048 4096 8192; do
  timeout 125 $TUNE --vary T --values $t --out $T/tune_T$t.csv > $T/tune_T$t.log 2>&1; echo "T=$t rc=$?"; grep -a "stored\|kept\|default\|wall time" $T/tune_T$t.log | tail -3 | cut -c1-200
done
cd /tmp/r10 && tar -czf $OUT/r10.tgz .
