#!/bin/bash
# session 26, fourth call (H200, FA4 installed): issue 20's detached rows and moda-fused's GPU tests;
# issue 21's H200 rows: the paper preset moda vs FA2, T = 1024/2048 (graph, eager), the L=0 path at
# 16K, moda_attention's gradients against the reference at odd T
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r4; mkdir -p $R/$G
MB="python3 -m moda_bench.cli"
st() { local n=$1 t=$2; shift 2; echo "=== $n $(date -u +%T)"; timeout $t "$@" > $R/$n.log 2>&1; echo "=== $n rc=$? $(date -u +%T)"; grep -a "x best\|passed\|failed\|health (end)" $R/$n.log | tail -3 | cut -c1-200; }
st detached 90 $MB sweep --require fa4,moda-fused --max-time 2 --vary T --values 16384,32768,65536 --depth-grad off \
    --providers moda-fused,moda-overlap,moda-fa4,fa4,cudnn --out $R/$G/limit-s26/detached
st paper-moda 200 $MB sweep --preset paper --providers moda,fa2 --max-time 1.5 --out $R/$G/paper-moda-s26
st short-t 60 $MB sweep --vary T --values 1024,2048 --timer graph,eager --providers moda,fa2,fa4 --require fa4 --max-time 2 \
    --out $R/$G/short-t-s26
st l0-fwd 45 $MB sweep --require fa4 --vary T --values 16384 --L 0 --pass fwd --providers fa2-triton,fa4,cudnn,fa2 --max-time 2 \
    --out $R/$G/l0-s26/fwd
st l0-bwd 45 $MB sweep --require fa4 --vary T --values 16384 --L 0 --pass bwd --providers fa2-triton,fa4,cudnn,fa2 --max-time 2 \
    --out $R/$G/l0-s26/bwd
st tests-grad 110 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_depth_grad.py -k "moda_attention"
st tests-fused 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fused_sm90.py
cd $R && tar -czf $OUT/r4.tgz .
