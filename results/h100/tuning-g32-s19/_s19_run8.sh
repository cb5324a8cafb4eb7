#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r10/$G/tuning-g32-s19b; mkdir -p $R
timeout 540 python3 -m moda_bench.cli tune --kernels fwd_depth,bwd_depth,fwd,bwd_q,bwd_kv --budget 6 --min-gain 3% --vary G --values 32 \
  --cache $R/tuning.json --out $R/tune_G32_all.csv > $R/tune_G32_all.log 2>&1; tail -n 25 $R/tune_G32_all.log
cd /tmp/r10 && tar -czf $OUT/r11.tgz .
