#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MB="python3 -m moda_bench.cli"
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r17/$G; mkdir -p $R/s17-h200
$MB doctor > $R/s17-h200/doctor.log 2>&1; tail -1 $R/s17-h200/doctor.log
timeout 100 $MB sweep --vary T --values 1024,2048 --timer graph,eager --providers moda,fa2 --max-time 2 --out $R/short-t-s17 > $R/short-t-s17.log 2>&1
python3 -c "
import pandas as pd; d=pd.read_csv('$R/short-t-s17/sweep_T.csv'); print(d[['provider','timer','T','median_ms','ratio_to_fa2','ratio_to_fa2_lo','ratio_to_fa2_hi','health']].to_string())"
timeout 90 $MB sweep --vary T --values 16384 --L 0 --pass bwd --providers fa2-triton,fa2,cudnn --max-time 2 --out $R/l0-bwd-s17 > $R/l0-bwd-s17.log 2>&1
python3 -c "
import pandas as pd; d=pd.read_csv('$R/l0-bwd-s17/sweep_T.csv'); print(d[['provider','T','median_ms','tflops','ratio_to_fa2','health']].to_string())"
timeout 330 $MB sweep --preset paper --providers moda,fa2 --max-time 2 --out $R/paper-moda-s17 > $R/paper-moda-s17.log 2>&1
python3 -c "
import pandas as pd, glob
for f in sorted(glob.glob('$R/paper-moda-s17/*.csv')):
    d=pd.read_csv(f); d=d[d.provider=='moda']; print(d[['T','G','L','median_ms','ratio_to_fa2','ratio_to_fa2_lo','ratio_to_fa2_hi','health']].to_string())"
cd /tmp/r17 && tar -czf $OUT/r17.tgz .
