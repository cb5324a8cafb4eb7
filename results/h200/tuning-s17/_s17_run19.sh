#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MB="python3 -m moda_bench.cli"
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r19/$G/tuning-s17; mkdir -p $R
timeout 150 $MB tune --kernels fwd,bwd_q,bwd_kv --budget 3 --min-gain 3% --cache $R/tuning.json --vary T --values 4096 --out $R/tune_T4096.csv > $R/tune.log 2>&1
tail -12 $R/tune.log
timeout 150 $MB tune --kernels fwd,bwd_q,bwd_kv --budget 3 --min-gain 3% --cache $R/tuning.json --vary G --values 2 --out $R/tune_G2.csv > $R/tune_g2.log 2>&1; tail -12 $R/tune_g2.log
$MB tune --show --cache $R/tuning.json > $R/show.log 2>&1; tail -8 $R/show.log
cd /tmp/r19 && tar -czf $OUT/r19.tgz .
