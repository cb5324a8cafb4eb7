#!/bin/bash
# session 16, call 1: an H200 gets issue 21's rows; an H100 gets the T=1024 diagnosis
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MB="python3 -m moda_bench.cli"
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r1/$G; mkdir -p $R
$MB doctor > $R/doctor.log 2>&1; tail -5 $R/doctor.log
if [ $G = h200 ]; then
  $MB sweep --preset paper --providers moda,fa2 --max-time 3 --out $R/paper-moda-s16 2>&1 | tail -30
  $MB sweep --vary T --values 16384 --L 0 --pass bwd --providers fa2-triton,fa2,cudnn --max-time 3 --out $R/l0-bwd-s16 2>&1 | tail -12
  $MB sweep --vary T --values 16384 --L 0 --pass fwd --providers fa2-triton,fa2,cudnn --max-time 3 --out $R/l0-fwd-s16 2>&1 | tail -12
  $MB sweep --vary T --values 1024 --timer graph,eager --providers moda,fa2 --max-time 2 --out $R/t1024-s16 2>&1 | tail -12
else
  D=$R/t1024-diag-s16; mkdir -p $D
  for T in 1024 2048; do
    timeout 120 python3 tools/host_probe.py --T $T --phases --kernels --calls 300 > $D/phases_T$T.log 2>&1; cat $D/phases_T$T.log
  done
  timeout 200 python3 tools/host_probe.py --T 1024 --variants 'kv_n=32;kv_n=32,kv_m=32;kv_n=16;q_m=32;q_n=32;fwd_m=32;fwd_depth=tma,block_m=128,num_warps=8;kv_w=8,kv_n=128;kv_s=2,q_s=2' > $D/variants_T1024.log 2>&1; cat $D/variants_T1024.log
  timeout 150 python3 tools/host_probe.py --T 2048 --variants 'kv_n=32;q_m=32;kv_n=32,q_m=32' > $D/variants_T2048.log 2>&1; cat $D/variants_T2048.log
fi
cd /tmp/r1 && tar -czf $OUT/r1.tgz .
