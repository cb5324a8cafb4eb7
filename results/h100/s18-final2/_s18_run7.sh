#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MB="python3 -m moda_bench.cli"
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r7/$G; D=$R/s18-final2; mkdir -p $D
$MB doctor > $D/doctor.log 2>&1; tail -1 $D/doctor.log
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_moda_bwd_chunks.py tests/test_moda_bwd_tma.py -k "not fa4" > $D/tests_bwd.log 2>&1; tail -n 1 $D/tests_bwd.log
timeout 100 $MB sweep --vary T --values 1024,2048 --timer graph,eager --providers moda,fa2 --max-time 2 --out $R/short-t-s18c > $R/short-t-s18c.log 2>&1
python3 -c "
import pandas as pd; d=pd.read_csv('$R/short-t-s18c/sweep_T.csv'); print(d[['provider','timer','T','median_ms','ratio_to_fa2','ratio_to_fa2_lo','ratio_to_fa2_hi','health']].to_string())"
cd /tmp/r7 && tar -czf $OUT/r7.tgz .
