#!/bin/bash
# session 20, call 8: on an H200, the paper preset (moda, FA2) and the G>=32 GPU tests; on an H100,
# the tuner at G=32 (all five groups) against the new default
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
if [ $G = h200 ]; then
  R=/tmp/r8/h200/paper-moda-s20; mkdir -p $R
  python3 -m moda_bench.cli doctor > $R/doctor.log 2>&1; tail -1 $R/doctor.log
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_moda_bwd_tma.py -k "wide_groups or default_tiles" > $R/tests_gpu.log 2>&1; tail -1 $R/tests_gpu.log
  timeout 420 python3 -m moda_bench.cli sweep --preset paper --providers moda,fa2 --max-time 2 --out $R > $R/sweep.log 2>&1; tail -1 $R/sweep.log
else
  R=/tmp/r8/h100/tuning-g32-s20; mkdir -p $R
  timeout 540 python3 -m moda_bench.cli tune --kernels fwd_depth,bwd_depth,fwd,bwd_q,bwd_kv --budget 6 --min-gain 3% --vary G --values 32 \
    --cache $R/tuning.json --out $R/tune_G32_all.csv > $R/tune_G32_all.log 2>&1; tail -n 22 $R/tune_G32_all.log
fi
cd /tmp/r8 && tar -czf $OUT/r8.tgz .
