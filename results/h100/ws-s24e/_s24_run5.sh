#!/bin/bash
# session 24, fifth call: registers of the probe's per-head dq pass, and the package's folded dq
# pass capped at 128 / 144 registers (four programs an SM) against its 168, L=0, T=16384
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r5; O=$R/$G/ws-s24e; mkdir -p $O
timeout 100 python3 tools/ws_probe.py --T 16384 --max-time 2 --passes-only \
  --variants "nows,dq=64x64w4s2;nows,dq=64x64w4s3" > $O/passes.log 2>&1; echo "rc=$?"; grep -E "^(regs|pass)" $O/passes.log
timeout 200 python3 tools/host_probe.py --T 16384 --L 0 --pass bwd --max-time 5 \
  --variants "bwd_q_maxnreg=128;bwd_q_maxnreg=144;bwd_q_maxnreg=128,bwd_q_stages=2" > $O/variants_bwd.log 2>&1; echo "rc=$?"; grep -v "^ *$" $O/variants_bwd.log | tail -6
cd $R && tar -czf $OUT/r5.tgz .
