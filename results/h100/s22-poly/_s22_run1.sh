#!/bin/bash
# session 22, first call: exp_poly (half of a pass's sequence probabilities on the FMA pipe):
# GPU gradients against fp64, then each pass alone and fwd+bwd against the default
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r1/$G/s22-poly; mkdir -p $R
MB="python3 -m moda_bench.cli"
$MB doctor > $R/doctor.log 2>&1; tail -1 $R/doctor.log
timeout 150 python3 -m pytest -q tests/test_exp_poly.py -m gpu > $R/tests_gpu.log 2>&1; tail -2 $R/tests_gpu.log
HP="timeout 110 python3 tools/host_probe.py"
$HP --T 16384 --L 0 --pass bwd --variants "exp_poly=2;exp_poly=4;exp_poly=6" --max-time 3 > $R/l0_bwd.log 2>&1; grep "graph\|eager\|fail" $R/l0_bwd.log
$HP --T 16384 --L 0 --pass fwd --variants "exp_poly=1" --max-time 2 > $R/l0_fwd.log 2>&1; grep "graph\|eager\|fail" $R/l0_fwd.log
$HP --T 16384 --L 64 --variants "exp_poly=1;exp_poly=6;exp_poly=7" --max-time 3 > $R/l64_16k.log 2>&1; grep "graph\|eager\|fail" $R/l64_16k.log
$HP --T 4096 --L 64 --variants "exp_poly=1;exp_poly=6;exp_poly=7" --max-time 2 > $R/l64_4k.log 2>&1; grep "graph\|eager\|fail" $R/l64_4k.log
$HP --T 1024 --L 64 --variants "exp_poly=7" --max-time 2 > $R/l64_1k.log 2>&1; grep "graph\|eager\|fail" $R/l64_1k.log
cd /tmp/r1 && tar -czf $OUT/r1.tgz .
