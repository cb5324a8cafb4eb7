#!/bin/bash
# session 20, last call: the paper preset (moda, FA2) on the final code, and the L=0 passes at T=16384
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r7/$G; mkdir -p $R/paper-moda-s20 $R/l0-s20
MB="python3 -m moda_bench.cli"
$MB doctor > $R/paper-moda-s20/doctor.log 2>&1; tail -1 $R/paper-moda-s20/doctor.log
timeout 90 $MB sweep --vary T --values 16384 --L 0 --pass bwd --providers fa2-triton,fa2,cudnn --max-time 3 --out $R/l0-s20/bwd > $R/l0-s20/bwd.log 2>&1; tail -1 $R/l0-s20/bwd.log
timeout 60 $MB sweep --vary T --values 16384 --L 0 --pass fwd --providers fa2-triton,fa2,cudnn --max-time 3 --out $R/l0-s20/fwd > $R/l0-s20/fwd.log 2>&1; tail -1 $R/l0-s20/fwd.log
timeout 400 $MB sweep --preset paper --providers moda,fa2 --max-time 2 --out $R/paper-moda-s20 > $R/paper-moda-s20/sweep.log 2>&1; tail -1 $R/paper-moda-s20/sweep.log
python3 - <<'PY'
import glob, pandas as pd
for f in sorted(glob.glob('/tmp/r7/*/l0-s20/*/sweep_*.csv')):
    d = pd.read_csv(f)
    print(f.split('/')[-2], d[['provider', 'pass', 'median_ms', 'tflops', 'ratio_to_best', 'ratio_to_best_lo', 'ratio_to_best_hi', 'health']].to_string(index=False))
for f in sorted(glob.glob('/tmp/r7/*/paper-moda-s20/sweep_*.csv')):
    d = pd.read_csv(f); d = d[d.provider == 'moda']
    print(f.split('/')[-1], d[['T', 'G', 'L', 'median_ms', 'ratio_to_fa2', 'ratio_to_fa2_lo', 'ratio_to_fa2_hi', 'health']].to_string(index=False))
PY
cd /tmp/r7 && tar -czf $OUT/r7.tgz .
