#!/usr/bin/env bash
# GPU call (issue 8, second probe): depth-only kernels with the head-fastest grid, depth tile
# variants and forward tiles; T family then the G=2 and L=256 shapes.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MODA_BENCH_NO_TUNING=1
mkdir -p $OUT/r
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 python3 -m pytest -q -m gpu tests/test_moda.py -k "placement or realistic" 2>&1 | tail -2
P="python3 scripts/kernel_probe.py"
timeout 200 $P --T 4096,16384 --G 8 --L 64 --variants default,dbm32,dbm128,bl32,ds2,f128w8f,f128w4,f128n128,rev,fused \
  --l0-variants default,f128w8f,f128w4 --passes fwdbwd,fwd --out $OUT/r/probe4_T.csv > $OUT/r/probe4_T.log 2>&1
grep -E "^T=" $OUT/r/probe4_T.log
timeout 120 $P --T 16384 --G 2 --L 64 --variants default,dbm32,dbm128,bl32,ds2,f128w8f,fused \
  --passes fwdbwd,fwd --out $OUT/r/probe4_G2.csv > $OUT/r/probe4_G2.log 2>&1
grep -E "^T=" $OUT/r/probe4_G2.log
timeout 120 $P --T 16384 --G 8 --L 256 --variants default,dbm32,dbm128,bl32,bl128,ds2,f128w8f,fused \
  --passes fwdbwd,fwd --out $OUT/r/probe4_L256.csv > $OUT/r/probe4_L256.log 2>&1
grep -E "^T=" $OUT/r/probe4_L256.log
tar czf $OUT/results.tgz -C $OUT/r . && ls $OUT
