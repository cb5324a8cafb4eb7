#!/usr/bin/env bash
# GPU call (issue 8 + 9): small co-resident side-stream depth kernels; the pooled --gpus worker
# path on one GPU (smoke preset).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MODA_BENCH_NO_TUNING=1 COLUMNS=160
mkdir -p $OUT/r
nvidia-smi --query-gpu=name --format=csv,noheader
P="python3 scripts/kernel_probe.py"
timeout 150 $P --T 4096,16384 --G 8 --L 64 --variants default,stw2,stw2s1,stw2f --l0-variants default \
  --passes fwdbwd,fwd --out $OUT/r/probe7_T.csv > $OUT/r/probe7_T.log 2>&1
grep -E "^T=" $OUT/r/probe7_T.log
timeout 100 $P --T 16384 --G 2 --L 64 --variants default,stw2,stw2s1,stw2f --l0-variants default \
  --passes fwdbwd --out $OUT/r/probe7_G2.csv > $OUT/r/probe7_G2.log 2>&1
grep -E "^T=" $OUT/r/probe7_G2.log
timeout 100 $P --T 16384 --G 8 --L 256 --variants default,stw2,stw2s1,stw2f --l0-variants default \
  --passes fwdbwd --out $OUT/r/probe7_L256.csv > $OUT/r/probe7_L256.log 2>&1
grep -E "^T=" $OUT/r/probe7_L256.log
timeout 120 python3 -m moda_bench.cli sweep --preset smoke --gpus all --out $OUT/r/smoke_pool > $OUT/r/smoke_pool.log 2>&1
echo "smoke --gpus all exit $?"; grep -vE "━" $OUT/r/smoke_pool.log | tail -8; ls $OUT/r/smoke_pool
tar czf $OUT/results.tgz -C $OUT/r . && ls $OUT
