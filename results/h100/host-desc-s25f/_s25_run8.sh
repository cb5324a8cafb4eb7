#!/bin/bash
# session 25, eighth call (8c51dcb, kept tensor maps keyed by the kernel's metadata): moda_attention's
# GPU gradient tests with depth_grad on and off (the call before found detached failures with maps
# shared across kernels), host vs device-side descriptors bitwise on CUDA, issue 21's T=1024 / 2048 rows
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r8; O=$R/$G/host-desc-s25f; mkdir -p $O
timeout 250 python3 -m pytest -q -m gpu -p no:cacheprovider -rf --tb=line tests/test_depth_grad.py -k "moda_attention" > $O/tests_depth_grad.log 2>&1; echo "depth_grad rc=$?"; grep "FAILED\|passed\|failed" $O/tests_depth_grad.log | head -12 | cut -c1-300
timeout 150 python3 -m pytest -q -p no:cacheprovider -rf --tb=line tests/test_descriptors.py > $O/tests_desc.log 2>&1; echo "desc rc=$?"; tail -1 $O/tests_desc.log
timeout 120 python3 -m moda_bench.cli sweep --vary T --values 1024,2048 --timer graph,eager --providers moda,fa2 --max-time 2 --pin-cpu 3 --out $O/short-t > $O/short-t.log 2>&1; tail -1 $O/short-t.log
cd $R && tar -czf $OUT/r8.tgz .
