#!/bin/bash
# session 21, ninth call: the tuner at T=1024 and 2048 on the session's defaults (short-T
# descriptor forward, cached launches): all five groups, budget 6, 3% margin
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r9/$G/tuning-short-s21; mkdir -p $R
timeout 420 python3 -m moda_bench.cli tune --kernels fwd_depth,bwd_depth,fwd,bwd_q,bwd_kv --budget 6 --min-gain 3% --vary T --values 1024,2048 \
  --cache $R/tuning.json --out $R/tune_short.csv > $R/tune_short.log 2>&1; tail -n 24 $R/tune_short.log
cd /tmp/r9 && tar -czf $OUT/r9.tgz .
