#!/usr/bin/env bash
# GPU call: the paper preset (tuned) and a short gate baseline sweep; results tarred into $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MODA_BENCH_TUNING_CACHE=$PWD/results/tuning/tuning.json
nvidia-smi --query-gpu=name --format=csv,noheader
/usr/bin/time -f "paper preset wall %e s" timeout 450 python3 -m moda_bench.cli sweep --preset paper --out $OUT/paper 2>&1 | tee $OUT/paper.log | grep -vE "━" | tail -70
timeout 100 python3 -m moda_bench.cli sweep --vary T --values 4096,8192 --providers moda,fa2,fa2-triton --out $OUT/gate_base 2>&1 | tail -12
tar czf $OUT/results.tgz -C $OUT paper gate_base && rm -rf $OUT/paper $OUT/gate_base
