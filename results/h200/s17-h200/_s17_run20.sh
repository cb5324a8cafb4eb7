#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r20/$G/s17-h200; mkdir -p $R
timeout 250 python3 -m pytest -q -p no:cacheprovider tests/test_moda_bwd_chunks.py tests/test_moda_bwd_tma.py -k "not fa4" > $R/tests_bwd.log 2>&1; tail -n 1 $R/tests_bwd.log
timeout 60 python3 tools/bwd_tma_check.py > $R/bwd_tma_check.log 2>&1; tail -n 1 $R/bwd_tma_check.log
cd /tmp/r20 && tar -czf $OUT/r20.tgz .
