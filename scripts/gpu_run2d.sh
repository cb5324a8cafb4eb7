#!/usr/bin/env bash
# GPU call: the paper preset (tuned), then the gate against the committed baseline: once as is
# (should pass) and once with a deliberately bad config injected (should fail).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MODA_BENCH_TUNING_CACHE=$PWD/results/tuning/tuning.json COLUMNS=160
mkdir -p $OUT/r
nvidia-smi --query-gpu=name --format=csv,noheader
/usr/bin/time -f "paper preset wall %e s" timeout 400 python3 -m moda_bench.cli sweep --preset paper --out $OUT/r/paper > $OUT/r/paper.log 2>&1
grep -vE "━" $OUT/r/paper.log | tail -5
B=results/baselines/h200_gate_baseline.csv
timeout 90 python3 -m moda_bench.cli gate --run --baseline $B --current $OUT/r/gate_pass.csv --summary $OUT/r/gate_pass.md > $OUT/r/gate_pass.log 2>&1
echo "gate (as is) exit code $?"; tail -25 $OUT/r/gate_pass.log
python3 scripts/gate_inject_slowdown.py $MODA_BENCH_TUNING_CACHE /tmp/bad_cache.json
MODA_BENCH_TUNING_CACHE=/tmp/bad_cache.json timeout 90 python3 -m moda_bench.cli gate --run --baseline $B --current $OUT/r/gate_fail.csv --summary $OUT/r/gate_fail.md > $OUT/r/gate_fail.log 2>&1
echo "gate (bad config injected) exit code $?"; tail -25 $OUT/r/gate_fail.log
tar czf $OUT/results.tgz -C $OUT/r . && rm -rf $OUT/r
