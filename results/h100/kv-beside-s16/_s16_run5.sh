#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MB="python3 -m moda_bench.cli"
R=/tmp/r5/h100; D=$R/kv-beside-s16; mkdir -p $D
for a in "--G 2" "--G 16" "--L 256" "--L 0" "--G 1"; do
  n=$(echo $a | tr -d ' -')
  timeout 120 python3 tools/host_probe.py --T 1024 $a --variants 'bwd_kv_beside=0;bwd_kv_beside=1' > $D/beside_T1024_$n.log 2>&1; cat $D/beside_T1024_$n.log
done
$MB sweep --vary T --values 1024,2048 --timer graph,eager --providers moda,fa2 --max-time 2 --out $R/t1024-s16 > $R/t1024-s16.log 2>&1
python3 -c "
import pandas as pd; d=pd.read_csv('$R/t1024-s16/sweep_T.csv'); print(d[['provider','timer','T','median_ms','ratio_to_fa2','ratio_to_fa2_lo','ratio_to_fa2_hi','of_floor','health']].to_string())"
cd /tmp/r5 && tar -czf $OUT/r5.tgz .
