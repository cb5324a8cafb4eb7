#!/bin/bash
# session 24, first call: Triton's automatic warp specialization on Hopper for the L=0 passes
# (tools/ws_probe.py: correctness against the package, then interleaved graph-timer times)
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"; python3 -c "import triton,torch;print('triton',triton.__version__,'torch',torch.__version__)"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r1; O=$R/$G/ws-s24; mkdir -p $O
timeout 60 python3 tools/ws_probe.py --compile-only > $O/compile.log 2>&1; cat $O/compile.log
timeout 330 python3 tools/ws_probe.py --T 16384,4096 --max-time 3 \
  --variants "ws;ws,fwd=128x64w4s3,dq=64x64w4s3,kv=64x128w4s3;ws,fwd=128x128w4s2,dq=64x128w4s3,kv=64x64w4s2;ws,kv=32x128w4s2,fwd=64x64w4s2;nows" \
  > $O/probe.log 2>&1; echo "rc=$?"; grep -v "^ " $O/probe.log | tail -60
cd $R && tar -czf $OUT/r1.tgz .
