#!/bin/bash
# session 23, fourth call (warm, FA4 installed by the third): issue 20's rows on today's kernels,
# then the L=0 path's forward and backward at T=16384 against FA4 and cuDNN
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r4; mkdir -p $R/$G
python3 -c "import flash_attn.cute" || { RESULTS=$R GPU=$G bash tools/device_session.sh fa4-big; }
RESULTS=$R GPU=$G MAX_TIME=2 FUSED_RUN=limit-s23 bash tools/device_session.sh fused-sweep-a fused-sweep-b > $R/limit.log 2>&1; grep "rc=" $R/limit.log
O=$R/$G/limit-s23; MB="python3 -m moda_bench.cli sweep --require fa4,moda-fused --max-time 2"
timeout 120 $MB --vary T --values 16384,32768,65536 --depth-grad off --providers moda-fused,moda-overlap,moda-fa4,fa4,cudnn --out $O/detached > $O/detached.log 2>&1; tail -1 $O/detached.log
L=$R/$G/l0-s23; mkdir -p $L
timeout 60 $MB --vary T --values 16384 --L 0 --pass bwd --providers fa2-triton,fa4,cudnn,fa2 --max-time 3 --out $L/bwd > $L/bwd.log 2>&1; tail -1 $L/bwd.log
timeout 60 $MB --vary T --values 16384 --L 0 --pass fwd --providers fa2-triton,fa4,cudnn,fa2 --max-time 3 --out $L/fwd > $L/fwd.log 2>&1; tail -1 $L/fwd.log
cd $R && tar -czf $OUT/r4.tgz .
