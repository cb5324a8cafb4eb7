#!/bin/bash
# session 23, twelfth call: T = 1024 and 2048, moda against FA2 alone, pinned to CPU 3 (as session 22's short-t rows)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r12/$G/short-t-s23b; mkdir -p $R
timeout 200 python3 -m moda_bench.cli sweep --vary T --values 1024,2048 --timer graph,eager --providers moda,fa2 --max-time 2 --pin-cpu 3 --out $R > $R/sweep.log 2>&1; tail -1 $R/sweep.log
cd /tmp/r12 && tar -czf $OUT/r12.tgz .
