#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=/tmp/r15/h100; D=$R/s17-regress; mkdir -p $D
timeout 300 python3 tools/_s17_regress.py > $D/regress.log 2>&1; cat $D/regress.log | tail -8
cd /tmp/r15 && tar -czf $OUT/r15.tgz .
