#!/bin/bash
# session 21, second call: GPU tests after the pointer launches' cache (8ad41e7); the host of an
# eager T=1024 call with it; T=1024 with the descriptor forward; the short-T rows (graph, eager)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r2/$G; mkdir -p $R/s21-host $R/short-t-s21
MB="python3 -m moda_bench.cli"
$MB doctor > $R/s21-host/doctor.log 2>&1; tail -1 $R/s21-host/doctor.log
timeout 150 python3 -m pytest -q tests/test_launch.py tests/test_moda_bwd_sub.py tests/test_moda_bwd_chunks.py -m gpu > $R/s21-host/tests_gpu_launch.log 2>&1; tail -1 $R/s21-host/tests_gpu_launch.log
timeout 300 python3 -m pytest -q tests/test_moda_bwd_tma.py tests/test_moda_tma.py -m gpu > $R/s21-host/tests_gpu_tma.log 2>&1; tail -1 $R/s21-host/tests_gpu_tma.log
timeout 60 taskset -c 3 python3 tools/host_probe.py --T 1024 --phases --calls 300 > $R/s21-host/phases_cached.log 2>&1; tail -3 $R/s21-host/phases_cached.log
timeout 60 taskset -c 3 python3 tools/host_probe.py --T 1024 --engine --calls 300 > $R/s21-host/engine_cached.log 2>&1; tail -3 $R/s21-host/engine_cached.log
timeout 60 taskset -c 3 python3 tools/host_probe.py --T 1024 --launch --max-time 2 > $R/s21-host/launch_T1024.log 2>&1; tail -6 $R/s21-host/launch_T1024.log
timeout 90 taskset -c 3 python3 tools/host_probe.py --T 1024 --variants "fwd_depth=tma,fwd_m=128,block_l=32,fwd_w=8;fwd_depth=tma,fwd_m=64,block_l=32,fwd_w=4" --max-time 2 > $R/s21-host/t1024_fwd_tma.log 2>&1; tail -8 $R/s21-host/t1024_fwd_tma.log
timeout 200 $MB sweep --vary T --values 1024,2048,4096 --timer graph,eager --providers moda,fa2 --max-time 2 --pin-cpu 3 --out $R/short-t-s21 > $R/short-t-s21/sweep.log 2>&1; tail -1 $R/short-t-s21/sweep.log
python3 - <<'PY'
import glob, pandas as pd
for f in sorted(glob.glob('/tmp/r2/*/short-t-s21/sweep_*.csv')):
    d = pd.read_csv(f); d = d[d.provider == 'moda']
    cols = [c for c in ['T', 'timer', 'median_ms', 'ratio_to_fa2', 'ratio_to_fa2_lo', 'ratio_to_fa2_hi', 'host_us', 'health'] if c in d]
    print(d[cols].to_string(index=False))
PY
cd /tmp/r2 && tar -czf $OUT/r2.tgz .
