#!/bin/bash
# session 23, eighth call: FA4's small wheels and the first half of its cu13 libraries
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
mkdir -p /tmp/r8/$G
RESULTS=/tmp/r8 GPU=$G bash tools/device_session.sh fa4-small fa4-part1 > /tmp/r8/fa4.log 2>&1; tail -1 /tmp/r8/fa4.log
echo $G > /tmp/r8/gpu
