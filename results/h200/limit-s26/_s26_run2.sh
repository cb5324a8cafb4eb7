#!/bin/bash
# session 26, second call: FA4's small wheels and the first half of its cu13 libraries (call 3 joins them)
set -uo pipefail
export PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
RESULTS=/tmp/r2 GPU=$G bash tools/device_session.sh fa4-small fa4-part1 doctor
cd /tmp/r2 && tar -czf $OUT/r2.tgz .
