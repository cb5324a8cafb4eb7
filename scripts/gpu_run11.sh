#!/usr/bin/env bash
# GPU call C (issue 8): (1) placement tests incl. the side stream launched after the sequence
# kernel; (2) probe: does launching the depth kernel after the sequence kernel overlap the depth
# bytes with the sequence compute (T=16384: G=8 L=64, G=2, L=256; fwd+bwd and fwd);
# (3) depth-group tuning with the launch-order fields (budget 8); (4) the 6-rung ablation ladder.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD COLUMNS=160
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
T0=$(date +%s); el() { echo "$1 at $(( $(date +%s) - T0 )) s"; }
timeout 60 python3 -m pytest -q -m gpu -s tests/test_moda.py -k placement > $R/gpu_tests.log 2>&1
el "gpu placement tests exit $?"; grep -E "^(fused|split|overlap|stream)|passed|failed" $R/gpu_tests.log | tail -7
export MODA_BENCH_NO_TUNING=1
P="python3 scripts/kernel_probe.py --variants default,after,after_w2,bwdafter --l0-variants default"
timeout 70 $P --T 16384 --G 8 --L 64 --passes fwdbwd,fwd --out $R/probe11_g8.csv > $R/probe11_g8.log 2>&1; el "probe g8 $?"
timeout 50 $P --T 16384 --G 2 --L 64 --passes fwdbwd --out $R/probe11_g2.csv > $R/probe11_g2.log 2>&1; el "probe g2 $?"
timeout 50 $P --T 16384 --G 8 --L 256 --passes fwdbwd --out $R/probe11_l256.csv > $R/probe11_l256.log 2>&1; el "probe l256 $?"
grep -hE "^T=" $R/probe11_*.log
unset MODA_BENCH_NO_TUNING
tune() { local name=$1 lim=$2; shift 2
  timeout $lim python3 -m moda_bench.cli tune --kernels fwd_depth,bwd_depth --budget 8 --cache $R/tuning.json \
    --out $R/tune_$name.csv "$@" > $R/tune_$name.log 2>&1; el "tune $name exit $?"; }
tune T 110 --vary T --values 4096,8192,16384,32768
tune G 150 --vary G --values 2,4,16,32
tune L 70 --vary L --values 128,256
grep -hE "^T=.*->" $R/tune_*.log
timeout 45 python3 -m moda_bench.cli ablate --out $R/ablation > $R/ablation.log 2>&1; el "ablate exit $?"
grep -E "│" $R/ablation.log | tail -7
tar czf $OUT/results.tgz -C $R . && ls -la $OUT
