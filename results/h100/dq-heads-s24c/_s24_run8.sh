#!/bin/bash
# session 24, eighth call, on the final rule (1843b58 + docs): GPU tests of the tma backward and the
# cached launches, then the L=0 rows (fwd+bwd over T; the backward alone at 16K) against cuDNN and FA2
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r8; O=$R/$G/dq-heads-s24c; mkdir -p $O
timeout 170 python3 -m pytest -q tests/test_moda_bwd_heads.py tests/test_launch.py -m "gpu or not gpu" -k "heads or launch" > $O/tests.log 2>&1; echo "tests rc=$?"; tail -2 $O/tests.log
timeout 120 python3 -m pytest -q tests/test_moda_bwd_tma.py -m gpu > $O/tests_tma.log 2>&1; echo "tests rc=$?"; tail -2 $O/tests_tma.log
MB="python3 -m moda_bench.cli sweep"
timeout 150 $MB --vary T --values 1024,4096,16384 --L 0 --timer graph --providers fa2-triton,cudnn,fa2 --max-time 2 --out $O/fwdbwd > $O/fwdbwd.log 2>&1; tail -1 $O/fwdbwd.log
timeout 100 $MB --vary T --values 16384 --L 0 --pass bwd --providers fa2-triton,cudnn,fa2 --max-time 6 --out $O/bwd > $O/bwd.log 2>&1; tail -1 $O/bwd.log
cd $R && tar -czf $OUT/r8.tgz .
