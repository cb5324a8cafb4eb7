#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD:$PWD/tests PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
D=/tmp/r12/$G/s19-decode-launch; mkdir -p $D
timeout 200 python3 -m pytest -q -rA -p no:cacheprovider tests/test_launch.py -m gpu > $D/tests_launch.log 2>&1; grep -E "PASSED|FAILED|passed|failed|Error" $D/tests_launch.log | tail -6
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_decode.py tests/test_decode_fused.py -m gpu > $D/tests_decode.log 2>&1; tail -n 2 $D/tests_decode.log
timeout 120 python3 results/h100/s19-decode-launch/_s19_decode_ab.py 2>&1 | grep -v Warn | tee $D/decode_ab.log
cd /tmp/r12 && tar -czf $OUT/r12.tgz .
