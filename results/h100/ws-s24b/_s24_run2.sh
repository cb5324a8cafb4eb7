#!/bin/bash
# session 24, second call: the WS probe's backward (eager timer; the graph capture of autograd's
# backward failed in call 1), then the L=0 backward and forward at T=16384 with longer sampling
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r2; O=$R/$G/ws-s24b; mkdir -p $O
timeout 200 python3 tools/ws_probe.py --T 16384 --max-time 3 \
  --variants "ws;nows;ws,kv=32x128w4s2;ws,kv=64x64w4s2" > $O/probe.log 2>&1; echo "rc=$?"; grep -v "^ " $O/probe.log | grep -v Warning | tail -30
L=$R/$G/l0-s24; mkdir -p $L; MB="python3 -m moda_bench.cli sweep"
timeout 150 $MB --vary T --values 16384 --L 0 --pass bwd --providers fa2-triton,cudnn,fa2 --max-time 8 --out $L/bwd > $L/bwd.log 2>&1; tail -3 $L/bwd.log
timeout 80 $MB --vary T --values 16384 --L 0 --pass fwd --providers fa2-triton,cudnn,fa2 --max-time 3 --out $L/fwd > $L/fwd.log 2>&1; tail -3 $L/fwd.log
cd $R && tar -czf $OUT/r2.tgz .
