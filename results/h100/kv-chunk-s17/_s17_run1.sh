#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MB="python3 -m moda_bench.cli"
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r1/$G; D=$R/kv-chunk-s17; mkdir -p $D
$MB doctor > $D/doctor.log 2>&1; tail -2 $D/doctor.log
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_moda_bwd_chunks.py tests/test_moda_bwd_tma.py -k "not fa4" > $D/tests.log 2>&1; tail -n 3 $D/tests.log
timeout 120 python3 tools/bwd_tma_check.py > $D/bwd_tma_check.log 2>&1; tail -n 2 $D/bwd_tma_check.log
timeout 100 python3 tools/host_probe.py --T 1024 --kernels --calls 100 > $D/kernels_T1024.log 2>&1; grep -E "us  x|in all|---" $D/kernels_T1024.log
for spec in "1024:8:64:bwd_kv_chunk=0;bwd_kv_chunk=2;bwd_kv_chunk=8" "2048:8:64:bwd_kv_chunk=0;bwd_kv_chunk=4;bwd_kv_chunk=8" \
            "4096:8:64:bwd_kv_chunk=16;bwd_kv_chunk=32" "1024:8:0:bwd_kv_chunk=0" "2048:8:0:bwd_kv_chunk=0" \
            "1024:16:64:bwd_kv_chunk=0" "1024:1:64:bwd_kv_chunk=0" "1024:8:256:bwd_kv_chunk=0"; do
  IFS=: read T GG L V <<< "$spec"
  echo "== T=$T G=$GG L=$L"
  timeout 150 python3 tools/host_probe.py --T $T --G $GG --L $L --variants "$V" --max-time 3 > $D/ab_T${T}_G${GG}_L${L}.log 2>&1
  grep -E "graph|eager|Error" $D/ab_T${T}_G${GG}_L${L}.log | tail -8
done
$MB sweep --vary T --values 1024,2048,4096 --timer graph,eager --providers moda,fa2 --max-time 2 --out $R/short-t-s17 > $R/short-t-s17.log 2>&1
python3 -c "
import pandas as pd; d=pd.read_csv('$R/short-t-s17/sweep_T.csv'); print(d[['provider','timer','T','median_ms','ratio_to_fa2','ratio_to_fa2_lo','ratio_to_fa2_hi','of_floor','max_rel_err','health']].to_string())"
cd /tmp/r1 && tar -czf $OUT/r1.tgz .
