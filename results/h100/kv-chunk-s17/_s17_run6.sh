#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=/tmp/r6/h100; D=$R/kv-chunk-s17; mkdir -p $D
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_moda_bwd_chunks.py tests/test_decode_fused.py tests/test_moda_bwd_tma.py -k "gpu" > $D/tests_gpu6.log 2>&1; tail -n 2 $D/tests_gpu6.log
timeout 200 python3 tools/_s17_hostab.py 1024 64 > $D/hostab6_T1024.log 2>&1; head -2 $D/hostab6_T1024.log
for spec in "1024:8:64:chunk=0;chunk=-1" "1024:8:0:chunk=0;chunk=-1"; do
  IFS=: read T GG L V <<< "$spec"
  echo "== T=$T G=$GG L=$L"
  timeout 150 python3 tools/host_probe.py --T $T --G $GG --L $L --variants "$V" --max-time 5 > $D/ab6_T${T}_G${GG}_L${L}.log 2>&1
  grep -E "host|graph|eager|Error" $D/ab6_T${T}_G${GG}_L${L}.log | tail -12
done
cd /tmp/r6 && tar -czf $OUT/r6.tgz .
