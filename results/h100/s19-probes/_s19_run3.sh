#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
PIN=(python3 -c "import os,sys;os.sched_setaffinity(0,{3});os.execvp(sys.argv[1],sys.argv[1:])")
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
echo "GPU: $NAME"
R=/tmp/r3/$G; D=$R/s19-probes; mkdir -p $D
timeout 120 "${PIN[@]}" python3 tools/host_probe.py --T 1024 --phases > $D/phases_pin.log 2>&1; grep -v Warn $D/phases_pin.log | head -30
timeout 120 "${PIN[@]}" python3 tools/host_probe.py --T 1024 --calls 300 --top 45 > $D/cprofile_pin.log 2>&1; grep -v Warn $D/cprofile_pin.log | head -60
cd /tmp/r3 && tar -czf $OUT/r3.tgz .
