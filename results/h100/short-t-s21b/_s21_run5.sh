#!/bin/bash
# session 21, fifth call: GPU tests on the short-T descriptor forward default (df3b470); the short-T
# rows (graph, eager, pinned); where an eager T=1024 call's host time goes now; G=32/64 at T=4096
# and G=64 at T=16384 with the descriptor forward
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r5/$G; mkdir -p $R/short-t-s21b $R/s21-host2 $R/g-big-s21
MB="python3 -m moda_bench.cli"
$MB doctor > $R/short-t-s21b/doctor.log 2>&1; tail -1 $R/short-t-s21b/doctor.log
timeout 240 python3 -m pytest -q tests/test_moda_tma.py tests/test_launch.py tests/test_moda_bwd_tma.py tests/test_moda.py -m gpu > $R/short-t-s21b/tests_gpu.log 2>&1; tail -1 $R/short-t-s21b/tests_gpu.log
timeout 200 $MB sweep --vary T --values 1024,2048,4096 --timer graph,eager --providers moda,fa2 --max-time 2 --pin-cpu 3 --out $R/short-t-s21b > $R/short-t-s21b/sweep.log 2>&1; tail -1 $R/short-t-s21b/sweep.log
timeout 60 taskset -c 3 python3 tools/host_probe.py --T 1024 --calls 300 --top 45 > $R/s21-host2/cprofile.log 2>&1; head -3 $R/s21-host2/cprofile.log
timeout 60 taskset -c 3 python3 tools/host_probe.py --T 1024 --phases --calls 300 > $R/s21-host2/phases.log 2>&1; tail -4 $R/s21-host2/phases.log
V="fwd_depth=tma,fwd_m=64,fwd_w=4,block_l=32;fwd_depth=tma,fwd_m=64,fwd_w=4,block_l=32,fwd_maxnreg=168"
timeout 80 python3 tools/host_probe.py --T 4096 --G 32 --variants "$V" --max-time 2 > $R/g-big-s21/fwd_T4096_G32.log 2>&1; grep -E "^  (graph|eager)" $R/g-big-s21/fwd_T4096_G32.log
timeout 80 python3 tools/host_probe.py --T 4096 --G 64 --variants "$V" --max-time 2 > $R/g-big-s21/fwd_T4096_G64.log 2>&1; grep -E "^  (graph|eager)" $R/g-big-s21/fwd_T4096_G64.log
timeout 120 python3 tools/host_probe.py --T 16384 --G 64 --variants "$V" --max-time 3 > $R/g-big-s21/fwd_T16384_G64.log 2>&1; grep -E "^  (graph|eager)" $R/g-big-s21/fwd_T16384_G64.log
python3 - <<'PY'
import glob, pandas as pd
for f in sorted(glob.glob('/tmp/r5/*/short-t-s21b/sweep_*.csv')):
    d = pd.read_csv(f); d = d[d.provider == 'moda']
    cols = [c for c in ['T', 'timer', 'median_ms', 'ratio_to_fa2', 'ratio_to_fa2_lo', 'ratio_to_fa2_hi', 'health'] if c in d]
    print(d[cols].to_string(index=False))
PY
cd /tmp/r5 && tar -czf $OUT/r5.tgz .
