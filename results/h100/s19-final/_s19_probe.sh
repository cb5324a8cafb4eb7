#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) ;; *) exit 0;; esac
mkdir -p /tmp/r8/h200
python3 -m moda_bench.cli doctor > /tmp/r8/h200/doctor.log 2>&1; tail -1 /tmp/r8/h200/doctor.log
RESULTS=/tmp/r8 GPU=h200 bash tools/device_session.sh fa4-small fa4-part1 > /tmp/r8/fa4.log 2>&1; tail -2 /tmp/r8/fa4.log
cd /tmp/r8 && tar -czf $OUT/r8.tgz .
