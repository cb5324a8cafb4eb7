#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r6/$G; D=$R/s19-final; mkdir -p $D
timeout 120 python3 -m pytest -q -rA -p no:cacheprovider tests/test_launch.py tests/test_host.py -m gpu > $D/tests_gpu_launch_host.log 2>&1; grep -E "PASSED|FAILED|SKIPPED|passed|failed" $D/tests_gpu_launch_host.log | tail -8
timeout 450 python3 -m pytest -q -p no:cacheprovider tests/test_moda_bwd_tma.py -k "not fa4" > $D/tests_gpu_bwd_tma.log 2>&1; tail -n 2 $D/tests_gpu_bwd_tma.log
cd /tmp/r6 && tar -czf $OUT/r6.tgz .
