#!/bin/bash
# session 23, first call: the GPU tests of a98fe1b (ops.launch.aligned16), then the tuner on the
# 64-row forward default at the rows where moda / FA2 is highest (T=4096, G=2, G=32, L=256)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r1/$G/s23-tests; mkdir -p $R
timeout 170 python3 -m pytest -q tests/test_launch.py tests/test_dattn_launch.py tests/test_decode.py -m gpu > $R/tests_gpu.log 2>&1; tail -1 $R/tests_gpu.log
T=/tmp/r1/$G/tuning-s23; mkdir -p $T
TUNE="python3 -m moda_bench.cli tune --kernels fwd_depth,bwd_depth,fwd,bwd_q,bwd_kv --budget 6 --min-gain 3% --cache $T/tuning.json"
timeout 100 $TUNE --vary T --values 4096 --out $T/tune_T.csv > $T/tune_T.log 2>&1; grep -a "stored" $T/tune_T.log
timeout 100 $TUNE --vary G --values 2 --out $T/tune_G2.csv > $T/tune_G2.log 2>&1; grep -a "stored" $T/tune_G2.log
timeout 110 $TUNE --vary L --values 256 --out $T/tune_L.csv > $T/tune_L.log 2>&1; grep -a "stored" $T/tune_L.log
timeout 100 $TUNE --vary G --values 32 --out $T/tune_G32.csv > $T/tune_G32.log 2>&1; grep -a "stored" $T/tune_G32.log
cd /tmp/r1 && tar -czf $OUT/r1.tgz .
