#!/bin/bash
# session 23, sixth call: FA4's small wheels and the first half of its cu13 libraries (for the
# seventh call), then moda-fa4's depth-only launches at T <= 4096 with the backward depth stages
# the "tma" default gives them (3) and with the pointer kernels' own default (2): alone, and
# beside cuDNN's sequence fwd+bwd (the contention moda-fa4 runs them in; no FA4 needed)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r6/$G/fa4-depth-stages-s23; mkdir -p $R
RESULTS=/tmp/r6 GPU=$G bash tools/device_session.sh fa4-small fa4-part1 > /tmp/r6/fa4.log 2>&1; tail -1 /tmp/r6/fa4.log
timeout 240 python3 tools/overlap_probe.py --seq cudnn --T 4096,2048 --passes bwd,fwdbwd --variants "bl=64;bl=64,ds=2" \
  --depth-alone --kernels rowblock --ctas 0 --alone-variants "bl=64;bl=64,ds=2" --max-time 3 --out $R/probe.csv > $R/probe.log 2>&1
grep -v "^#" $R/probe.log | tail -20
cd /tmp/r6 && tar -czf $OUT/r6.tgz .
