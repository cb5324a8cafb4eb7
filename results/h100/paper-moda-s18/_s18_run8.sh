#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MB="python3 -m moda_bench.cli"
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r8/$G; mkdir -p $R
$MB doctor > $R/doctor-paper-moda-s18.log 2>&1; tail -1 $R/doctor-paper-moda-s18.log
timeout 480 $MB sweep --preset paper --providers moda,fa2 --max-time 2 --out $R/paper-moda-s18 > $R/paper-moda-s18.log 2>&1
python3 -c "
import pandas as pd,glob
for f in sorted(glob.glob('$R/paper-moda-s18/sweep_*.csv')):
    d=pd.read_csv(f); d=d[d.provider=='moda']; print(d[['T','G','L','median_ms','ratio_to_fa2','ratio_to_fa2_lo','ratio_to_fa2_hi','health']].to_string(index=False))"
cd /tmp/r8 && tar -czf $OUT/r8.tgz .
