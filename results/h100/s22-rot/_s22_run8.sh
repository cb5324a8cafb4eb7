#!/bin/bash
# session 22, eighth call: the descriptor forward's rotated loop (the next tile's scores in flight
# during the current softmax), forward alone and fwd+bwd, against the default
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r8/$G/s22-rot; mkdir -p $R
python3 -m moda_bench.cli doctor > $R/doctor.log 2>&1; tail -1 $R/doctor.log
timeout 100 python3 -m pytest -q tests/test_moda_tma.py -m gpu > $R/tests_gpu.log 2>&1; tail -1 $R/tests_gpu.log
timeout 360 python3 tools/_s22_rot.py "16384,64;16384,0;4096,64;1024,64" 2 > $R/rot.log 2>&1; grep "T=" $R/rot.log
cd /tmp/r8 && tar -czf $OUT/r8.tgz .
