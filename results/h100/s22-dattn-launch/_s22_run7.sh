#!/bin/bash
# session 22, seventh call: Depth-Attention's launches from CachedLaunch (d68f660): the GPU test
# (bitwise Triton's path) and eager host / time, cached against Triton's path
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r7/$G/s22-dattn-launch; mkdir -p $R
python3 -m moda_bench.cli doctor > $R/doctor.log 2>&1; tail -1 $R/doctor.log
timeout 200 python3 -m pytest -q tests/test_dattn_launch.py tests/test_dattn.py tests/test_dattn_chained.py -m gpu > $R/tests_gpu.log 2>&1; tail -1 $R/tests_gpu.log
timeout 200 taskset -c 3 python3 tools/_s22_dattn_launch.py "1024,4;4096,4;1024,16" 2 > $R/launch.log 2>&1; cat $R/launch.log | grep "T="
cd /tmp/r7 && tar -czf $OUT/r7.tgz .
