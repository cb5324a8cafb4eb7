#!/usr/bin/env bash
# GPU call: correctness tests on CUDA, the ablation ladder, a smoke sweep.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MODA_BENCH_TUNING_CACHE=$PWD/results/tuning/tuning.json
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python3 -m pytest tests/test_moda.py tests/test_sweep.py tests/test_tuning.py -m gpu -q -s 2>&1 | tee $OUT/gpu_tests.log | grep -E "rel errors|passed|failed|Error|error" | tail -20
timeout 150 python3 -m pytest tests/test_ladder.py -q -x 2>&1 | tail -3 | tee $OUT/ladder_tests.log
/usr/bin/time -f "ablate wall %e s" timeout 240 python3 -m moda_bench.cli ablate --out $OUT/ablation 2>&1 | tee $OUT/ablate.log | tail -25
