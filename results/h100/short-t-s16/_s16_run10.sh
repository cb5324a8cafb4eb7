#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MB="python3 -m moda_bench.cli"
R=/tmp/r10/h100; mkdir -p $R/dq-mix-s16
MIX_SHAPES=8192x8x64,8192x2x64,4096x8x256,2048x16x64 timeout 200 python3 tools/_s16_mix.py 2.5 2>&1 | tee $R/dq-mix-s16/mix_more.log
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_moda_bwd_tma.py -k "not fa4" > $R/dq-mix-s16/tests_bwd_tma.log 2>&1; tail -n 2 $R/dq-mix-s16/tests_bwd_tma.log
$MB sweep --vary T --values 1024,2048,4096,8192 --timer graph,eager --providers moda,fa2 --max-time 2 --out $R/short-t-s16 > $R/short-t-s16.log 2>&1
python3 -c "
import pandas as pd; d=pd.read_csv('$R/short-t-s16/sweep_T.csv'); print(d[['provider','timer','T','median_ms','ratio_to_fa2','ratio_to_fa2_lo','ratio_to_fa2_hi','of_floor','max_rel_err','health']].to_string())"
cd /tmp/r10 && tar -czf $OUT/r10.tgz .
