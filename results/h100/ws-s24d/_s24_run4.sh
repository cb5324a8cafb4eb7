#!/bin/bash
# session 24, fourth call: why the per-head dq pass (5.42 ms) beats the package's folded one
# (5.84): the package's dq pass at 2 stages and uncapped, against the default, backward alone at
# L=0, T=16384; and the probe's dq pass with the row statistics computed and stored in-kernel
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r4; O=$R/$G/ws-s24d; mkdir -p $O
timeout 200 python3 tools/host_probe.py --T 16384 --L 0 --pass bwd --max-time 5 \
  --variants "bwd_q_stages=2;bwd_q_maxnreg=0;bwd_q_stages=2,bwd_q_maxnreg=0" > $O/variants_bwd.log 2>&1; echo "rc=$?"; grep -v "^ *$" $O/variants_bwd.log | tail -12
timeout 200 python3 tools/ws_probe.py --T 16384 --max-time 6 --passes-only \
  --variants "nows,dq=64x64w4s2;nows,dq=64x64w4s3;nows,dq=128x64w4s2" > $O/passes.log 2>&1; echo "rc=$?"; grep -E "^(check|pass)" $O/passes.log
cd $R && tar -czf $OUT/r4.tgz .
