#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MB="python3 -m moda_bench.cli"
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r2/$G; D=$R/s18-dp-first; mkdir -p $D
$MB doctor > $D/doctor2.log 2>&1; tail -1 $D/doctor2.log
timeout 300 python3 tools/_s18_ab.py > $D/ab2.log 2>&1; cat $D/ab2.log
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_moda_bwd_chunks.py tests/test_moda_bwd_tma.py -k "not fa4" > $D/tests_bwd2.log 2>&1; tail -n 1 $D/tests_bwd2.log
timeout 150 $MB sweep --vary T --values 1024,2048,4096 --timer graph,eager --providers moda,fa2 --max-time 2 --out $R/short-t-s18 > $R/short-t-s18.log 2>&1
python3 -c "
import pandas as pd; d=pd.read_csv('$R/short-t-s18/sweep_T.csv'); print(d[['provider','timer','T','median_ms','ratio_to_fa2','ratio_to_fa2_lo','ratio_to_fa2_hi','health']].to_string())"
cd /tmp/r2 && tar -czf $OUT/r2.tgz .
