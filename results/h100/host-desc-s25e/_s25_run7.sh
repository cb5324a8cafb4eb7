#!/bin/bash
# session 25, seventh call (host-side descriptors with kept tensor maps): the paper preset moda vs
# FA2 (issue 21's 11 rows), the host cost of a T=1024 call by phase, moda_attention's GPU gradient
# tests with depth_grad on and off
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r7; mkdir -p $R/$G
O=$R/$G/paper-moda-s25; mkdir -p $O
timeout 330 python3 -m moda_bench.cli sweep --preset paper --providers moda,fa2 --max-time 2 --out $O > $O/sweep.log 2>&1; echo "paper rc=$?"; tail -2 $O/sweep.log
O=$R/$G/host-desc-s25e; mkdir -p $O
timeout 45 python3 tools/host_probe.py --phases --T 1024 --calls 200 > $O/phases.log 2>&1; cat $O/phases.log
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_depth_grad.py -k "moda_attention or detached_backward_not_slower and not fa4" > $O/tests_depth_grad.log 2>&1; echo "tests rc=$?"; tail -1 $O/tests_depth_grad.log
cd $R && tar -czf $OUT/r7.tgz .
