#!/bin/bash
# session 23, second call: FA4's small wheels and the first half of its cu13 libraries, then the
# decode GPU tests the first call's 170 s limit left (the SDPA / FA4 / FlashInfer peers, the bandwidth report)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r2/$G/s23-tests; mkdir -p $R
RESULTS=/tmp/r2 GPU=$G bash tools/device_session.sh fa4-small fa4-part1 > /tmp/r2/fa4.log 2>&1; tail -2 /tmp/r2/fa4.log
timeout 150 python3 -m pytest -q tests/test_decode.py -m gpu -k "sdpa_peer or fa4_peer or flashinfer or bandwidth" > $R/tests_gpu_decode_rest.log 2>&1; tail -1 $R/tests_gpu_decode_rest.log
cd /tmp/r2 && tar -czf $OUT/r2.tgz .
