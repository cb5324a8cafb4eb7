#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MB="python3 -m moda_bench.cli"
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r18/$G/tuning-s17; mkdir -p $R
timeout 380 $MB tune --kernels bwd_kv,bwd_q --budget 4 --min-gain 3% --cache $R/tuning.json --vary T --values 1024,2048 --out $R/tune_T.csv > $R/tune.log 2>&1
tail -25 $R/tune.log
$MB tune --show --cache $R/tuning.json > $R/show.log 2>&1; tail -8 $R/show.log
cd /tmp/r18 && tar -czf $OUT/r18.tgz .
