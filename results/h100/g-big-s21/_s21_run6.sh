#!/bin/bash
# session 21, sixth call: more L=0 backward tiles at T=16384; G=32 at T <= 4096 with the capped
# descriptor forward; T=1024's kernels with the short-T descriptor forward
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r6/$G; mkdir -p $R/s21-l0 $R/g-big-s21 $R/s21-host2
MB="python3 -m moda_bench.cli"
$MB doctor > $R/s21-l0/doctor2.log 2>&1; tail -1 $R/s21-l0/doctor2.log
timeout 240 python3 tools/host_probe.py --T 16384 --L 0 --variants "kv_m=32;kv_m=128;q_m=128,q_w=8,bwd_q_maxnreg=0;kv_s=2,q_s=2;bwd_kv_maxnreg=0" --max-time 3 > $R/s21-l0/variants2.log 2>&1; grep -E "^  (graph|eager)|failed" $R/s21-l0/variants2.log
V="fwd_depth=tma,fwd_m=64,fwd_w=4,block_l=32,fwd_maxnreg=168;fwd_depth=tma,fwd_m=64,fwd_w=4,block_l=32"
for T in 1024 2048; do
  timeout 60 python3 tools/host_probe.py --T $T --G 32 --variants "$V" --max-time 2 > $R/g-big-s21/fwd_T${T}_G32.log 2>&1; echo "T=$T G=32"; grep -E "^  (graph|eager)|failed" $R/g-big-s21/fwd_T${T}_G32.log
done
timeout 60 python3 tools/host_probe.py --T 1024 --kernels > $R/s21-host2/kernels_t1024.log 2>&1; grep -E "us " $R/s21-host2/kernels_t1024.log | head -12
cd /tmp/r6 && tar -czf $OUT/r6.tgz .
