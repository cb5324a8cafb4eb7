#!/bin/bash
# session 21, last call: the GPU tests on the final code (cached launches' shared helper, the backward's plan, memoised checks)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r10/$G/s21-final; mkdir -p $R
timeout 250 python3 -m pytest -q tests/test_launch.py tests/test_moda_bwd_tma.py tests/test_moda.py -m gpu > $R/tests_gpu.log 2>&1; tail -3 $R/tests_gpu.log
cd /tmp/r10 && tar -czf $OUT/r10.tgz .
