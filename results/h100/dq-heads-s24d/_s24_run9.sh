#!/bin/bash
# session 24, ninth call: GPU tests on the review commit 84fc983 (the dq loops in one helper)
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"; git log --oneline -1 2>/dev/null
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r9; O=$R/$G/dq-heads-s24d; mkdir -p $O
timeout 100 python3 -m pytest -q tests/test_moda_bwd_heads.py > $O/tests_heads.log 2>&1; echo "rc=$?"; tail -1 $O/tests_heads.log
timeout 80 python3 -m pytest -q tests/test_moda_bwd_tma.py -m gpu > $O/tests_tma.log 2>&1; echo "rc=$?"; tail -1 $O/tests_tma.log
cd $R && tar -czf $OUT/r9.tgz .
