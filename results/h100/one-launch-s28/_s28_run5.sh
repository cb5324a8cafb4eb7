#!/bin/bash
# session 28, fifth call: the one launch's WAIT order (commit after 3cf6da1: dq blocks first, key-major items
# waiting on ready counters) on the GPU: its tests (a hang would time out), then against the two launches
# and FA2, interleaved in one process, at T=1024 (G=8 L=64, G=1, G=16, L=0, L=256), 2048, 4096
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r5; K=$R/$G/tests-s28; O=$R/$G/one-launch-s28; mkdir -p $K $O
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_moda_bwd_one.py > $K/one_tests3.log 2>&1
echo "tests rc=$?"; tail -2 $K/one_tests3.log
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_moda_bwd_one.py -k "not gpu" > $K/one_tests3_cpu_on_gpu.log 2>&1
echo "small-shape tests on the GPU rc=$?"; tail -1 $K/one_tests3_cpu_on_gpu.log
for pt in "1024 8 64" "1024 1 64" "1024 8 0" "1024 16 64" "1024 8 256" "2048 8 64" "4096 8 64"; do set -- $pt
  timeout 80 python3 tools/_s28_one_ab.py --T $1 --G $2 --L $3 --max-time 1.5 > $O/wait_T$1_G$2_L$3.log 2>&1
  echo "rc=$?"; cat $O/wait_T$1_G$2_L$3.log | grep -v "^\s*$"
done
cd $R && tar -czf $OUT/r5.tgz .
