#!/bin/bash
# session 22, sixth call: the paper preset (moda, FA2) on the final code 8d35f99 (its kernels are the
# twenty-first session's: exp_poly is off by default)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r6/$G/paper-moda-s22; mkdir -p $R
MB="python3 -m moda_bench.cli"
$MB doctor > $R/doctor.log 2>&1; tail -1 $R/doctor.log
timeout 420 $MB sweep --preset paper --providers moda,fa2 --max-time 2 --out $R > $R/sweep.log 2>&1; tail -1 $R/sweep.log
python3 - <<'PY'
import glob, pandas as pd
for f in sorted(glob.glob('/tmp/r6/*/paper-moda-s22/sweep_*.csv')):
    d = pd.read_csv(f); d = d[d.provider == 'moda']
    print(d[['T', 'G', 'L', 'median_ms', 'ratio_to_fa2', 'ratio_to_fa2_lo', 'ratio_to_fa2_hi', 'of_floor', 'health']].to_string(index=False))
PY
cd /tmp/r6 && tar -czf $OUT/r6.tgz .
