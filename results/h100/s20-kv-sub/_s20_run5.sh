#!/bin/bash
# session 20, call 5: GPU tests of the sub-group key-major pass (and the changed row helpers), then
# fwd+bwd with kv_sub 1 / 2 / 4 at the paper's points
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r6/$G; D=$R/s20-kv-sub; mkdir -p $D
python3 -m moda_bench.cli doctor > $D/doctor.log 2>&1; tail -1 $D/doctor.log
echo "tests: see the first call (results/h100/s20-kv-sub/tests_gpu*.log)"

timeout 330 python3 tools/_s20_sub.py "16384,8,0,2,4;16384,8,64,2,4;16384,2,64,2;16384,4,64,2;8192,8,64,2;4096,8,64,2;16384,8,256,2;16384,16,64,2,4;16384,32,64,2,4" > $D/sub.log 2>&1; cat $D/sub.log | grep -v Warn | tail -12
cd /tmp/r6 && tar -czf $OUT/r6.tgz .
