#!/usr/bin/env bash
# GPU call (issue 8): split vs side-stream depth kernels (tuned depth stages), forward tile 128 x w8.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MODA_BENCH_NO_TUNING=1
mkdir -p $OUT/r
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 -m pytest -q -m gpu tests/test_moda.py -k "placement or realistic" -s 2>&1 | grep -E "rel errors|: out=|passed|failed|Error" | tail -12
P="python3 scripts/kernel_probe.py"
timeout 200 $P --T 4096,16384 --G 8 --L 64 --variants default,stream,splitstr,split128,stream128 \
  --l0-variants default,split128 --passes fwdbwd,fwd --out $OUT/r/probe6_T.csv > $OUT/r/probe6_T.log 2>&1
grep -E "^T=" $OUT/r/probe6_T.log
timeout 100 $P --T 16384 --G 2 --L 64 --variants default,stream,splitstr,split128 --l0-variants default \
  --passes fwdbwd,fwd --out $OUT/r/probe6_G2.csv > $OUT/r/probe6_G2.log 2>&1
grep -E "^T=" $OUT/r/probe6_G2.log
timeout 100 $P --T 16384 --G 8 --L 256 --variants default,stream,splitstr,split128 --l0-variants default \
  --passes fwdbwd,fwd --out $OUT/r/probe6_L256.csv > $OUT/r/probe6_L256.log 2>&1
grep -E "^T=" $OUT/r/probe6_L256.log
tar czf $OUT/results.tgz -C $OUT/r . && ls $OUT
