#!/bin/bash
# session 22, eleventh call: the GPU tests after the review (the shared cached-launch helper,
# exp_poly_share) on the final code
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r11/$G/s22-final3; mkdir -p $R
timeout 200 python3 -m pytest -q tests/test_launch.py tests/test_dattn_launch.py tests/test_exp_poly.py -m gpu > $R/tests_gpu.log 2>&1; tail -1 $R/tests_gpu.log
cd /tmp/r11 && tar -czf $OUT/r11.tgz .
