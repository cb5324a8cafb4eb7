#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MB="python3 -m moda_bench.cli"
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r1/$G/s18-dp-first; mkdir -p $R
$MB doctor > $R/doctor.log 2>&1; tail -1 $R/doctor.log
RESULTS=/tmp/r1 GPU=$G bash tools/device_session.sh fa4-small fa4-part1 > $R/fa4.log 2>&1; tail -2 $R/fa4.log
timeout 280 python3 tools/_s18_ab.py > $R/ab.log 2>&1; cat $R/ab.log | grep "^T="
timeout 60 python3 tools/_s18_handoff.py 1024 > $R/handoff.log 2>&1; cat $R/handoff.log
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_moda_bwd_chunks.py tests/test_moda_bwd_tma.py -k "not fa4" > $R/tests_bwd.log 2>&1; tail -n 1 $R/tests_bwd.log
cd /tmp/r1 && tar -czf $OUT/r1.tgz .
