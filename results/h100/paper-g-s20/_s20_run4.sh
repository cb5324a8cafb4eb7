#!/bin/bash
# session 20, call 4: the new G >= 32 backward default on the GPU: gradient tests, the paper's G rows
# (moda, FA2), and the S=2 depth sub-tile probe at G=32
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r4/$G; mkdir -p $R/s20-g32 $R/paper-g-s20
python3 -m moda_bench.cli doctor > $R/paper-g-s20/doctor.log 2>&1; tail -1 $R/paper-g-s20/doctor.log
timeout 200 python3 -m pytest -q -rA -p no:cacheprovider tests/test_moda_bwd_tma.py -k "gpu or default_tiles or G32 or default_choice" > $R/s20-g32/tests_gpu.log 2>&1; grep -E "PASSED|FAILED|passed|failed" $R/s20-g32/tests_gpu.log | tail -12
timeout 240 python3 -m moda_bench.cli sweep --vary G --providers moda,fa2 --max-time 2 --out $R/paper-g-s20 > $R/paper-g-s20/sweep.log 2>&1; tail -2 $R/paper-g-s20/sweep.log
python3 - <<'PY'
import glob, pandas as pd
for f in glob.glob('/tmp/r4/*/paper-g-s20/sweep_*.csv'):
    d = pd.read_csv(f)
    print(d[['provider', 'T', 'G', 'L', 'median_ms', 'ratio_to_fa2', 'ratio_to_fa2_lo', 'ratio_to_fa2_hi', 'tflops', 'of_floor', 'health']].to_string(index=False))
PY
timeout 120 python3 tools/_s20_s2.py > $R/s20-g32/s2_probe.log 2>&1; cat $R/s20-g32/s2_probe.log | tail -8
cd /tmp/r4 && tar -czf $OUT/r4.tgz .
