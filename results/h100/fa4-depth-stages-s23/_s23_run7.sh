#!/bin/bash
# session 23, seventh call (warm, after the sixth): FA4's cu13 libraries, moda-fa4's GPU tests with
# its depth-only backward at the pointer kernels' 2 stages where moda's default is "tma", then
# moda-fa4 against FA4 at T = 2048, 4096, 8192 (graph and eager)
set -uo pipefail
export PYTHONUNBUFFERED=1
R=/tmp/r7; mkdir -p $R/h100
RESULTS=$R GPU=h100 bash tools/device_session.sh fa4-big > $R/fa4-big.log 2>&1; tail -1 $R/fa4-big.log
export PYTHONPATH=$PWD:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages
O=$R/h100/fa4-depth-stages-s23; mkdir -p $O
timeout 200 python3 -m pytest -q -m gpu tests/test_fa4.py tests/test_depth_grad.py > $O/tests_gpu.log 2>&1; tail -1 $O/tests_gpu.log
timeout 150 python3 -m moda_bench.cli sweep --require fa4 --vary T --values 2048,4096,8192 --timer graph,eager --providers moda-fa4,moda-overlap,fa4 --max-time 2 --out $O/sweep > $O/sweep.log 2>&1; tail -1 $O/sweep.log
cd $R && tar -czf $OUT/r7.tgz .
