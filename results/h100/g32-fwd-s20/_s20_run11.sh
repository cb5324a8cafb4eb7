#!/bin/bash
# session 20, call 11: the G=32 descriptor forward default on the GPU: tests, the G rows fwd+bwd and forward
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r11/$G/g32-fwd-s20; mkdir -p $R
python3 -m moda_bench.cli doctor > $R/doctor.log 2>&1; tail -1 $R/doctor.log
timeout 150 python3 -m pytest -q -rA -p no:cacheprovider tests/test_moda_tma.py tests/test_moda_bwd_tma.py -k "G32 or wide_groups or gpu_tma_bf16" > $R/tests_gpu.log 2>&1; grep -E "PASSED|FAILED|passed|failed" $R/tests_gpu.log | tail -12
timeout 150 python3 -m moda_bench.cli sweep --vary G --values 8,16,32 --providers moda,fa2 --max-time 2 --out $R/fwdbwd > $R/fwdbwd.log 2>&1; tail -n 1 $R/fwdbwd.log
timeout 100 python3 -m moda_bench.cli sweep --vary G --values 16,32 --pass fwd --providers moda,fa2 --max-time 2 --out $R/fwd > $R/fwd.log 2>&1; tail -n 1 $R/fwd.log
python3 - <<'PY'
import glob, pandas as pd
for f in sorted(glob.glob('/tmp/r11/*/g32-fwd-s20/*/sweep_*.csv')):
    d = pd.read_csv(f); d = d[d.provider == 'moda']
    print(f.split('/')[-2], d[['pass', 'G', 'median_ms', 'ratio_to_fa2', 'ratio_to_fa2_lo', 'ratio_to_fa2_hi', 'health']].to_string(index=False))
PY
cd /tmp/r11 && tar -czf $OUT/r11.tgz .
