#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MB="python3 -m moda_bench.cli"
R=/tmp/r4/h100; D=$R/kv-beside-s16; mkdir -p $D
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_moda_bwd_tma.py -k "not fa4" > $D/tests_bwd_tma.log 2>&1; tail -3 $D/tests_bwd_tma.log
timeout 120 python3 tools/bwd_tma_check.py > $D/bwd_tma_check.log 2>&1; tail -6 $D/bwd_tma_check.log
for T in 1024 2048 4096; do
  timeout 150 python3 tools/host_probe.py --T $T --variants 'bwd_kv_beside=0;bwd_kv_beside=1' > $D/beside_T$T.log 2>&1; cat $D/beside_T$T.log
done
timeout 100 python3 tools/host_probe.py --T 4096 --G 2 --variants 'bwd_kv_beside=0;bwd_kv_beside=1' > $D/beside_T4096_G2.log 2>&1; cat $D/beside_T4096_G2.log
timeout 100 python3 tools/host_probe.py --T 2048 --L 0 --variants 'bwd_kv_beside=0;bwd_kv_beside=1' > $D/beside_T2048_L0.log 2>&1; cat $D/beside_T2048_L0.log
timeout 250 python3 -m pytest -q -m gpu -p no:cacheprovider --timeout 200 tests/test_moda.py tests/test_moda_tma.py -k "not fa4" > $D/tests_gpu.log 2>&1; tail -3 $D/tests_gpu.log
cd /tmp/r4 && tar -czf $OUT/r4.tgz .
