#!/bin/bash
# session 25, twelfth call (final code): the L=0 forward and backward at T=16384 (issue 21's TFLOP/s
# rows), T=4096 under the graph timer
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r12; O=$R/$G/l0-s25; mkdir -p $O
MB="python3 -m moda_bench.cli sweep"
timeout 120 $MB --vary T --values 16384 --L 0 --pass fwd --providers fa2-triton,cudnn,fa2 --max-time 3 --out $O/fwd > $O/fwd.log 2>&1; tail -1 $O/fwd.log
timeout 150 $MB --vary T --values 16384 --L 0 --pass bwd --providers fa2-triton,cudnn,fa2 --max-time 3 --out $O/bwd > $O/bwd.log 2>&1; tail -1 $O/bwd.log
timeout 120 $MB --vary T --values 4096 --timer graph --providers moda,fa2 --max-time 2 --out $O/t4096 > $O/t4096.log 2>&1; tail -1 $O/t4096.log
cd $R && tar -czf $OUT/r12.tgz .
