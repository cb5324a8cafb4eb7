#!/bin/bash
# session 23, third call (warm, right after the second): FA4's cu13 libraries, doctor, then the
# paper preset with every MoDA provider and every Hopper peer on today's kernels
set -uo pipefail
export PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r3; mkdir -p $R/$G
RESULTS=$R GPU=$G bash tools/device_session.sh fa4-big > $R/fa4-big.log 2>&1; tail -1 $R/fa4-big.log
export PYTHONPATH=$PWD:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages
python3 -m moda_bench.cli doctor > $R/$G/doctor.log 2>&1; tail -1 $R/$G/doctor.log
O=$R/$G/paper-all-s23; mkdir -p $O
timeout 480 python3 -m moda_bench.cli sweep --require fa4,moda-fused --preset paper \
  --providers moda,moda-fa4,moda-overlap,moda-fused,fa2,fa4,cudnn --max-time 2 --out $O > $O/sweep.log 2>&1; tail -2 $O/sweep.log
cd $R && tar -czf $OUT/r3.tgz .
