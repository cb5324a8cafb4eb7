#!/bin/bash
# session 21, fourth call: the tma backward's depth part beside the sequence passes (probe), and the
# descriptor forward at T <= 2048 over G and L (for FUSED_DEPTH_MAX_T's forward rule)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r4/$G; mkdir -p $R/s21-short
MB="python3 -m moda_bench.cli"
$MB doctor > $R/s21-short/doctor.log 2>&1; tail -1 $R/s21-short/doctor.log
timeout 300 taskset -c 3 python3 tools/_s21_beside.py "1024,8,64;2048,8,64;4096,8,64;1024,1,64;1024,8,256;1024,16,64" 2 > $R/s21-short/beside.log 2>&1; cat $R/s21-short/beside.log
V="fwd_depth=tma,fwd_m=128,block_l=32,fwd_w=8"
for P in "2048 8 8 64" "1024 1 8 64" "1024 2 8 64" "1024 16 8 64" "1024 8 8 256" "2048 8 8 0" "1024 8 8 0"; do
  set -- $P
  timeout 60 taskset -c 3 python3 tools/host_probe.py --T $1 --G $2 --Hk $3 --L $4 --variants "$V" --max-time 1.5 > $R/s21-short/fwd_tma_T$1_G$2_L$4.log 2>&1
  echo "T=$1 G=$2 L=$4"; grep -E "graph|eager" $R/s21-short/fwd_tma_T$1_G$2_L$4.log | grep -v default
done
cd /tmp/r4 && tar -czf $OUT/r4.tgz .
