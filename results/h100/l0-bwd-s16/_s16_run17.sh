#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MB="python3 -m moda_bench.cli"
R=/tmp/r17/h100; mkdir -p $R/l0-bwd-ncu-s16
$MB sweep --vary T --values 8192,16384 --L 0 --pass bwd --providers fa2-triton,fa2,cudnn --max-time 3 --out $R/l0-bwd-s16 > $R/l0-bwd-s16.log 2>&1
python3 -c "
import pandas as pd; d=pd.read_csv('$R/l0-bwd-s16/sweep_T.csv'); print(d[['provider','T','median_ms','tflops','ratio_to_best','ratio_to_best_lo','ratio_to_best_hi','of_floor','health']].to_string())"
timeout 100 python3 tools/bwd_tma_check.py > $R/l0-bwd-ncu-s16/bwd_tma_check.log 2>&1; tail -n 1 $R/l0-bwd-ncu-s16/bwd_tma_check.log
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_moda_bwd_tma.py -k "not fa4" > $R/l0-bwd-ncu-s16/tests_bwd_tma.log 2>&1; tail -n 1 $R/l0-bwd-ncu-s16/tests_bwd_tma.log
cd /tmp/r17 && tar -czf $OUT/r17.tgz .
