#!/usr/bin/env bash
# GPU call B (issue 8): with the committed tuning cache (results/tuning/tuning.json): the paper
# preset (fwd+bwd), the T sweep forward-only, the ablation ladder (naive rung included) and the
# CI gate baseline refresh, all on one H200. Needs MODA_BENCH_GIT_COMMIT set by the caller.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD COLUMNS=160 MODA_BENCH_TUNING_CACHE=$PWD/results/tuning/tuning.json
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
T0=$(date +%s)
/usr/bin/time -f "paper preset wall %e s" timeout 250 python3 -m moda_bench.cli sweep --preset paper \
  --out $R/paper > $R/paper.log 2>&1; echo "paper exit $? at $(( $(date +%s) - T0 )) s"
timeout 90 python3 -m moda_bench.cli sweep --vary T --pass fwd --out $R/fwd > $R/fwd.log 2>&1
echo "fwd sweep exit $? at $(( $(date +%s) - T0 )) s"
timeout 80 python3 -m moda_bench.cli ablate --out $R/ablation > $R/ablation.log 2>&1
echo "ablate exit $? at $(( $(date +%s) - T0 )) s"
cp results/baselines/h200_gate_baseline.csv $R/gate_baseline.csv
timeout 60 python3 -m moda_bench.cli gate --run --baseline $R/gate_baseline.csv --current $R/gate_current.csv \
  --summary $R/gate.md --update-baseline > $R/gate.log 2>&1; echo "gate exit $? at $(( $(date +%s) - T0 )) s"
grep -h "wall" $R/paper.log; tail -3 $R/gate.log
tar czf $OUT/results.tgz -C $R . && ls -la $OUT
