#!/bin/bash
# session 21, third call: the L=0 backward's tiles at T=16384 (dq pass 128 x 32 of 8 warps, key-major
# 128 keys of 8 warps); G=32 and G=64 at T=4096 and G=64 at T=16384 on the session-20 defaults
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r3/$G; mkdir -p $R/s21-l0 $R/g-big-s21
MB="python3 -m moda_bench.cli"
$MB doctor > $R/s21-l0/doctor.log 2>&1; tail -1 $R/s21-l0/doctor.log
timeout 240 python3 tools/host_probe.py --T 16384 --L 0 --variants "q_m=128,q_n=32,q_w=8;q_m=128,q_n=32,q_w=8,bwd_q_maxnreg=0;q_n=32;kv_n=128,kv_w=8;kv_n=128,kv_w=8,bwd_kv_maxnreg=0" --max-time 3 > $R/s21-l0/variants.log 2>&1; tail -14 $R/s21-l0/variants.log
timeout 150 $MB sweep --vary G --values 32,64 --T 4096 --providers moda,fa2 --max-time 2 --out $R/g-big-s21/t4096 > $R/g-big-s21/t4096.log 2>&1; tail -1 $R/g-big-s21/t4096.log
timeout 150 $MB sweep --vary G --values 64 --providers moda,fa2 --max-time 2 --out $R/g-big-s21/t16384 > $R/g-big-s21/t16384.log 2>&1; tail -1 $R/g-big-s21/t16384.log
python3 - <<'PY'
import glob, pandas as pd
for f in sorted(glob.glob('/tmp/r3/*/g-big-s21/*/sweep_*.csv')):
    d = pd.read_csv(f); d = d[d.provider == 'moda']
    print(d[['T', 'G', 'L', 'median_ms', 'ratio_to_fa2', 'ratio_to_fa2_lo', 'ratio_to_fa2_hi', 'health']].to_string(index=False))
PY
cd /tmp/r3 && tar -czf $OUT/r3.tgz .
