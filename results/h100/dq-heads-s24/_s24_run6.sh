#!/bin/bash
# session 24, sixth call: the per-head dq pass at L = 0 (bwd_dq_heads, kernel_bwd_tma._dq_head_kernel):
# GPU tests against the fp64 reference, then interleaved against the folded pass (host_probe
# --variants, fwd+bwd graph and eager; the backward alone at 16K), then the L=0 rows of the suite
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r6; O=$R/$G/dq-heads-s24; mkdir -p $O
timeout 150 python3 -m pytest -q tests/test_moda_bwd_heads.py tests/test_moda_bwd_tma.py -x > $O/tests.log 2>&1; echo "tests rc=$?"; tail -2 $O/tests.log
timeout 60 python3 tools/host_probe.py --T 16384 --L 0 --pass bwd --max-time 4 --variants "bwd_dq_heads=0" > $O/bwd_T16384.log 2>&1; grep -E "eager|graph" $O/bwd_T16384.log | tail -3
for spec in "16384 8" "32768 8" "8192 8" "4096 8" "2048 8" "16384 2" "16384 16" "16384 4"; do
  set -- $spec
  timeout 45 python3 tools/host_probe.py --T $1 --G $2 --L 0 --max-time 2 --variants "bwd_dq_heads=0;bwd_dq_heads=1" > $O/fwdbwd_T$1_G$2.log 2>&1
  echo "T=$1 G=$2"; grep -E "^  (graph|eager) bwd_dq" $O/fwdbwd_T$1_G$2.log
done
L=$R/$G/l0-s24b; mkdir -p $L; MB="python3 -m moda_bench.cli sweep"
timeout 100 $MB --vary T --values 16384 --L 0 --pass bwd --providers fa2-triton,cudnn,fa2 --max-time 6 --out $L/bwd > $L/bwd.log 2>&1; tail -1 $L/bwd.log
cd $R && tar -czf $OUT/r6.tgz .
