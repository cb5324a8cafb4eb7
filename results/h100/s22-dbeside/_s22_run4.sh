#!/bin/bash
# session 22, fourth call: the backward's depth part as its own descriptor launch beside the
# sequence passes (depth_beside), fwd+bwd against the default at short and long T; the GPU tests
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r4/$G/s22-dbeside; mkdir -p $R
MB="python3 -m moda_bench.cli"
$MB doctor > $R/doctor.log 2>&1; tail -1 $R/doctor.log
timeout 120 python3 -m pytest -q tests/test_moda_bwd_tma.py tests/test_exp_poly.py -m gpu > $R/tests_gpu.log 2>&1; tail -1 $R/tests_gpu.log
timeout 360 python3 tools/_s22_dbeside.py "1024,8,64;2048,8,64;4096,8,64;1024,1,64;1024,8,256;1024,16,64;16384,8,64" 2 > $R/dbeside.log 2>&1; grep -v "^\s*$" $R/dbeside.log | tail -24
timeout 60 taskset -c 3 python3 tools/host_probe.py --T 1024 --kernels > $R/kernels_T1024.log 2>&1; grep "in all\|---" $R/kernels_T1024.log
cd /tmp/r4 && tar -czf $OUT/r4.tgz .
