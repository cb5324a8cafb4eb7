#!/bin/bash
# session 21, seventh call: GPU tests after the backward's launch plan (1d2bd38); the host of an
# eager T=1024 call; the short-T rows (graph, eager, pinned) on the final code
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r7/$G; mkdir -p $R/short-t-s21c
MB="python3 -m moda_bench.cli"
$MB doctor > $R/short-t-s21c/doctor.log 2>&1; tail -1 $R/short-t-s21c/doctor.log
timeout 250 python3 -m pytest -q tests/test_launch.py tests/test_moda_bwd_sub.py tests/test_moda_bwd_chunks.py tests/test_moda_bwd_tma.py tests/test_moda_tma.py -m gpu > $R/short-t-s21c/tests_gpu.log 2>&1; tail -1 $R/short-t-s21c/tests_gpu.log
timeout 60 taskset -c 3 python3 tools/host_probe.py --T 1024 --phases --calls 300 > $R/short-t-s21c/phases.log 2>&1; tail -4 $R/short-t-s21c/phases.log
timeout 200 $MB sweep --vary T --values 1024,2048,4096 --timer graph,eager --providers moda,fa2 --max-time 2 --pin-cpu 3 --out $R/short-t-s21c > $R/short-t-s21c/sweep.log 2>&1; tail -1 $R/short-t-s21c/sweep.log
python3 - <<'PY'
import glob, pandas as pd
for f in sorted(glob.glob('/tmp/r7/*/short-t-s21c/sweep_*.csv')):
    d = pd.read_csv(f); d = d[d.provider == 'moda']
    cols = [c for c in ['T', 'timer', 'median_ms', 'ratio_to_fa2', 'ratio_to_fa2_lo', 'ratio_to_fa2_hi', 'health'] if c in d]
    print(d[cols].to_string(index=False))
PY
cd /tmp/r7 && tar -czf $OUT/r7.tgz .
