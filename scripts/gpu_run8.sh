#!/usr/bin/env bash
# GPU call (issue 8 final): retune the paper preset for the new kernel, run the paper preset with
# that cache, then re-run the CI gate's baseline points and update the baseline copy.
# Needs MODA_BENCH_GIT_COMMIT set by the caller (the device copy has no .git).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD COLUMNS=160
mkdir -p $OUT/r
nvidia-smi --query-gpu=name --format=csv,noheader
/usr/bin/time -f "tune wall %e s" timeout 230 python3 -m moda_bench.cli tune --preset paper --budget 3 \
  --cache $OUT/r/tuning.json --out $OUT/r/tune_paper.csv > $OUT/r/tune.log 2>&1
grep -vE "━" $OUT/r/tune.log | tail -16
export MODA_BENCH_TUNING_CACHE=$OUT/r/tuning.json
/usr/bin/time -f "paper preset wall %e s" timeout 270 python3 -m moda_bench.cli sweep --preset paper --out $OUT/r/paper > $OUT/r/paper.log 2>&1
grep -vE "━" $OUT/r/paper.log | tail -3
cp results/baselines/h200_gate_baseline.csv $OUT/r/gate_baseline.csv
timeout 80 python3 -m moda_bench.cli gate --run --baseline $OUT/r/gate_baseline.csv --current $OUT/r/gate_current.csv \
  --summary $OUT/r/gate.md --update-baseline > $OUT/r/gate.log 2>&1
echo "gate exit code $?"; tail -14 $OUT/r/gate.log
tar czf $OUT/results.tgz -C $OUT/r . && rm -rf $OUT/r && ls $OUT
