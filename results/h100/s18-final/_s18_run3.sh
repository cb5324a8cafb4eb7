#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MB="python3 -m moda_bench.cli"
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r3; D=$R/$G/s18-final; mkdir -p $D
$MB doctor > $D/doctor.log 2>&1; tail -1 $D/doctor.log
if [ $G = h200 ]; then RESULTS=$R GPU=$G bash tools/device_session.sh fa4-small fa4-part1 > $D/fa4.log 2>&1; tail -2 $D/fa4.log; fi
timeout 220 python3 -m pytest -q -p no:cacheprovider tests/test_moda_bwd_chunks.py tests/test_moda_bwd_tma.py -k "not fa4" > $D/tests_bwd.log 2>&1; tail -n 1 $D/tests_bwd.log
cd $R && tar -czf $OUT/r3.tgz .
