#!/bin/bash
# session 24, third call: the package's kernels at L=0, T=16384 (torch.profiler, each kernel's
# GPU time), then the probe's per-head passes without warp specialization at several tiles,
# interleaved in one loop (the unspecialised per-head dq pass read 5.40 ms in call 2)
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r3; O=$R/$G/ws-s24c; mkdir -p $O
timeout 120 python3 tools/host_probe.py --kernels --T 16384 --L 0 --calls 20 > $O/kernels_T16384_L0.log 2>&1; echo "rc=$?"; grep -v "^ *$" $O/kernels_T16384_L0.log | tail -25
timeout 120 python3 tools/host_probe.py --kernels --T 1024 --L 64 --calls 50 > $O/kernels_T1024_L64.log 2>&1; echo "rc=$?"; grep -v "^ *$" $O/kernels_T1024_L64.log | tail -25
timeout 300 python3 tools/ws_probe.py --T 16384 --max-time 8 --passes-only \
  --variants "nows,dq=64x64w4s2,kv=64x64w4s2;nows,dq=64x64w4s3,kv=64x64w4s3;nows,dq=128x64w8s2,kv=128x64w8s2;nows,dq=64x128w4s2,kv=64x128w8s2;nows,dq=128x128w8s2,kv=128x128w8s2;nows,dq=128x64w4s2,kv=32x64w4s2;ws" \
  > $O/passes.log 2>&1; echo "rc=$?"; grep -E "^(check|pass)" $O/passes.log
cd $R && tar -czf $OUT/r3.tgz .
