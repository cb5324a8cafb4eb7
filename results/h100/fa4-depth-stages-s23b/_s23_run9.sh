#!/bin/bash
# session 23, ninth call (warm, after the eighth): FA4's cu13 libraries, then the moda-fa4 GPU tests
# of test_depth_grad (depth_grad on and detached, T = 1000 / 2048, G = 1-16, L = 0-256, d = 64 / 128)
# that the seventh call's time limit left, on c0c9814 (the depth-only backward at 2 stages)
set -uo pipefail
export PYTHONUNBUFFERED=1
G=$(cat /tmp/r8/gpu 2>/dev/null || echo h100)
R=/tmp/r9; mkdir -p $R/$G/fa4-depth-stages-s23b
RESULTS=$R GPU=$G bash tools/device_session.sh fa4-big > $R/fa4-big.log 2>&1; tail -1 $R/fa4-big.log
export PYTHONPATH=$PWD:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages
timeout 420 python3 -m pytest -q -m gpu tests/test_depth_grad.py -k "moda_fa4" > $R/$G/fa4-depth-stages-s23b/tests_gpu.log 2>&1
tail -2 $R/$G/fa4-depth-stages-s23b/tests_gpu.log
cd $R && tar -czf $OUT/r9.tgz .
