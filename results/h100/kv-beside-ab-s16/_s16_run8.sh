#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MB="python3 -m moda_bench.cli"
R=/tmp/r8/h100; D=$R/kv-beside-ab-s16; mkdir -p $D
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_moda_bwd_tma.py -k "not fa4" > $D/tests_bwd_tma_final.log 2>&1; tail -n 3 $D/tests_bwd_tma_final.log
$MB sweep --vary T --values 1024,2048 --timer graph,eager --providers moda,fa2 --max-time 3 --out $R/t1024-s16-final > $R/t1024-s16-final.log 2>&1
python3 -c "
import pandas as pd; d=pd.read_csv('$R/t1024-s16-final/sweep_T.csv'); print(d[['provider','timer','T','median_ms','ratio_to_fa2','ratio_to_fa2_lo','ratio_to_fa2_hi','of_floor','max_rel_err','health']].to_string())"
cd /tmp/r8 && tar -czf $OUT/r8.tgz .
