#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=/tmp/r14/h100; D=$R/s17-final; mkdir -p $D
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_moda_bwd_chunks.py tests/test_moda_bwd_tma.py -k "gpu or detached or items" > $D/tests_bwd_review2.log 2>&1; tail -n 1 $D/tests_bwd_review2.log
timeout 120 python3 tools/bwd_tma_check.py > $D/bwd_tma_check_review2.log 2>&1; tail -n 1 $D/bwd_tma_check_review2.log
timeout 100 python3 tools/host_probe.py --T 1024 --kernels --calls 100 > $D/kernels_T1024_review2.log 2>&1; grep -E "us  x|in all" $D/kernels_T1024_review2.log | head -4
cd /tmp/r14 && tar -czf $OUT/r14.tgz .
