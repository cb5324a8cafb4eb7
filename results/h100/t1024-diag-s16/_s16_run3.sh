#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MB="python3 -m moda_bench.cli"
R=/tmp/r3/h100; D=$R/t1024-diag-s16; mkdir -p $D
timeout 200 python3 tools/host_probe.py --T 1024 --engine --calls 1000 > $D/engine_sampler_T1024.log 2>&1; cat $D/engine_sampler_T1024.log
$MB sweep --vary T --values 1024 --timer eager --providers moda,fa2 --max-time 2 --out $R/t1024-poll25-s16 2>&1 | grep -E "moda|fa2" | tail -4
MODA_BENCH_GPU_POLL_S=0 $MB sweep --vary T --values 1024 --timer eager --providers moda,fa2 --max-time 2 --out $R/t1024-poll0-s16 2>&1 | grep -E "moda|fa2" | tail -4
MODA_BENCH_GPU_POLL_S=0.25 $MB sweep --vary T --values 1024 --timer eager --providers moda,fa2 --max-time 2 --out $R/t1024-poll250-s16 2>&1 | grep -E "moda|fa2" | tail -4
for f in $R/t1024-poll*/sweep_T.csv; do python3 -c "
import pandas as pd,sys; d=pd.read_csv('$f'); print('$f'); print(d[['provider','timer','median_ms','ratio_to_fa2','ratio_to_fa2_lo','ratio_to_fa2_hi','samples','own_sm_clock_mhz']].to_string())"; done
cd /tmp/r3 && tar -czf $OUT/r3.tgz .
