#!/bin/bash
# session 22, tenth call: the final code with the 64-row 4-warp forward default: GPU tests, the
# paper preset (moda, FA2), the short rows, the L=0 forward at 16K
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r10/$G; mkdir -p $R/s22-final2 $R/paper-moda-s22b $R/short-t-s22b $R/l0-s22b
MB="python3 -m moda_bench.cli"
$MB doctor > $R/s22-final2/doctor.log 2>&1; tail -1 $R/s22-final2/doctor.log
timeout 150 python3 -m pytest -q tests/test_moda_tma.py tests/test_moda.py tests/test_exp_poly.py tests/test_launch.py -m gpu > $R/s22-final2/tests_gpu.log 2>&1; tail -1 $R/s22-final2/tests_gpu.log
timeout 170 $MB sweep --preset paper --providers moda,fa2 --max-time 2 --out $R/paper-moda-s22b > $R/paper-moda-s22b/sweep.log 2>&1; tail -1 $R/paper-moda-s22b/sweep.log
timeout 80 $MB sweep --vary T --values 1024,2048 --timer graph,eager --providers moda,fa2 --max-time 2 --pin-cpu 3 --out $R/short-t-s22b > $R/short-t-s22b/sweep.log 2>&1; tail -1 $R/short-t-s22b/sweep.log
timeout 60 $MB sweep --vary T --values 16384 --L 0 --pass fwd --providers fa2-triton,fa2,cudnn --max-time 3 --out $R/l0-s22b > $R/l0-s22b/fwd.log 2>&1; tail -1 $R/l0-s22b/fwd.log
python3 - <<'PY'
import glob, pandas as pd
for f in sorted(glob.glob('/tmp/r10/*/*/sweep_*.csv')):
    d = pd.read_csv(f)
    cols = [c for c in ['provider', 'pass', 'timer', 'T', 'G', 'L', 'median_ms', 'tflops', 'ratio_to_fa2', 'ratio_to_fa2_lo', 'ratio_to_fa2_hi', 'health'] if c in d.columns]
    print(f); print(d[d.provider != 'fa2'][cols].to_string(index=False))
PY
cd /tmp/r10 && tar -czf $OUT/r10.tgz .
