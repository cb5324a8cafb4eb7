#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MB="python3 -m moda_bench.cli"
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r7/$G; mkdir -p $R
if [ $G = h200 ]; then
  $MB doctor > $R/doctor.log 2>&1; tail -3 $R/doctor.log
  $MB sweep --preset paper --providers moda,fa2 --max-time 3 --out $R/paper-moda-s16 2>&1 | tail -20
  $MB sweep --vary T --values 16384 --L 0 --pass bwd --providers fa2-triton,fa2,cudnn --max-time 3 --out $R/l0-bwd-s16 2>&1 | tail -8
  $MB sweep --vary T --values 1024,2048 --timer graph,eager --providers moda,fa2 --max-time 2 --out $R/t1024-s16 2>&1 | tail -8
else
  D=$R/kv-beside-ab-s16; mkdir -p $D
  timeout 150 python3 tools/host_probe.py --T 1024 --phases --calls 1000 > $D/phases_T1024.log 2>&1; cat $D/phases_T1024.log
  timeout 150 python3 tools/host_probe.py --T 1024 --variants 'bwd_kv_beside=0;bwd_kv_beside=1' --max-time 5 > $D/ab_T1024.log 2>&1; cat $D/ab_T1024.log
  timeout 150 python3 tools/host_probe.py --T 1024 --L 256 --variants 'bwd_kv_beside=0;bwd_kv_beside=1' --max-time 4 > $D/ab_T1024_L256.log 2>&1; cat $D/ab_T1024_L256.log
  timeout 150 python3 tools/host_probe.py --T 1024 --G 1 --variants 'bwd_kv_beside=0;bwd_kv_beside=1' --max-time 4 > $D/ab_T1024_G1.log 2>&1; cat $D/ab_T1024_G1.log
fi
cd /tmp/r7 && tar -czf $OUT/r7.tgz .
