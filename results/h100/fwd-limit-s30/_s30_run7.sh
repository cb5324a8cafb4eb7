#!/bin/bash
# session 30, seventh call (asked for the H200 kind): on an H200, the fifth call's program (_s30_run5.sh);
# on an H100, FA4's small wheels and first part staged for the eighth call, and the doctor
set -uo pipefail
export PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME $(date -u +%T)"
case "$NAME" in *H200*) exec bash tools/_s30_run5.sh;; esac
R=/tmp/r7; mkdir -p $R/h100
RESULTS=$R GPU=h100 bash tools/device_session.sh fa4-small fa4-part1 > $R/fa4.log 2>&1; echo "fa4 staged rc=$?"
timeout 60 python3 -m moda_bench.cli doctor > $R/h100/doctor.log 2>&1; echo "doctor rc=$?"; tail -2 $R/h100/doctor.log
cd $R && tar -czf $OUT/r7.tgz h100
