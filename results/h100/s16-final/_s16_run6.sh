#!/bin/bash
# session 16, last call: an H200 gets issue 21's rows; an H100 gets the checks of the final commit
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MB="python3 -m moda_bench.cli"
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r6/$G; mkdir -p $R
if [ $G = h200 ]; then
  $MB doctor > $R/doctor.log 2>&1; tail -3 $R/doctor.log
  $MB sweep --preset paper --providers moda,fa2 --max-time 3 --out $R/paper-moda-s16 2>&1 | tail -20
  $MB sweep --vary T --values 16384 --L 0 --pass bwd --providers fa2-triton,fa2,cudnn --max-time 3 --out $R/l0-bwd-s16 2>&1 | tail -8
  $MB sweep --vary T --values 16384 --L 0 --pass fwd --providers fa2-triton,fa2,cudnn --max-time 3 --out $R/l0-fwd-s16 2>&1 | tail -8
  $MB sweep --vary T --values 1024,2048 --timer graph,eager --providers moda,fa2 --max-time 2 --out $R/t1024-s16 2>&1 | tail -8
else
  D=$R/s16-final; mkdir -p $D
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_moda_bwd_tma.py tests/test_moda.py -k "not fa4" > $D/tests_moda_bwd_tma.log 2>&1; tail -2 $D/tests_moda_bwd_tma.log
  timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider --timeout 200 tests/test_moda_tma.py tests/test_depth_grad.py -k "not fa4" > $D/tests_gpu.log 2>&1; tail -2 $D/tests_gpu.log
  timeout 120 python3 tools/bwd_tma_check.py > $D/bwd_tma_check.log 2>&1; tail -2 $D/bwd_tma_check.log
  timeout 120 python3 tools/host_probe.py --T 1024 --phases --calls 500 > $D/phases_T1024.log 2>&1; cat $D/phases_T1024.log
fi
cd /tmp/r6 && tar -czf $OUT/r6.tgz .
