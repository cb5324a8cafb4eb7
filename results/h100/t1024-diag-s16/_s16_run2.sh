#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=/tmp/r2/h100/t1024-diag-s16; mkdir -p $R
nproc; python3 -c "import sys;print(sys.version, sys.getswitchinterval())"
timeout 200 python3 tools/host_probe.py --T 1024 --engine --calls 300 > $R/engine_T1024.log 2>&1; cat $R/engine_T1024.log
timeout 100 python3 tools/host_probe.py --T 1024 --cpu-trace > $R/cputrace_T1024.log 2>&1; cat $R/cputrace_T1024.log
cd /tmp/r2 && tar -czf $OUT/r2.tgz .
