#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=/tmp/r5/h100; D=$R/kv-chunk-s17; mkdir -p $D
timeout 200 python3 tools/_s17_hostab.py 1024 64 > $D/hostab_T1024.log 2>&1; cat $D/hostab_T1024.log | cut -c1-150
cd /tmp/r5 && tar -czf $OUT/r5.tgz .
