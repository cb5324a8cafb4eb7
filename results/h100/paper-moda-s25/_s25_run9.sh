#!/bin/bash
# session 25, ninth call (8c51dcb): the paper preset, moda against FA2 (issue 21's 11 rows)
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r9; O=$R/$G/paper-moda-s25; mkdir -p $O
timeout 540 python3 -m moda_bench.cli sweep --preset paper --providers moda,fa2 --max-time 1.5 --out $O > $O/sweep.log 2>&1; echo "paper rc=$?"; tail -2 $O/sweep.log
cd $R && tar -czf $OUT/r9.tgz .
